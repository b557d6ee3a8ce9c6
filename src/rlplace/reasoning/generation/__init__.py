"""Generation engines for the LLM rollout behind one interface (`engine`), one module per backend (`hf`, `vllm`),
registered in `backends` (which configs import without torch: so this package's init imports nothing)."""
