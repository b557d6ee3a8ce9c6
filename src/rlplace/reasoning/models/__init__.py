"""The causal LMs of reasoning tasks: the tiny LM built here, its character tokenizer, model-folder checks, and the
critic (a value head on a copy of the LM)."""
