"""Extension by registration: one `Registry` per kind of extension point (tasks, rewards, rollout backends, ...).

A new task, reward or backend is one module plus one `register` line; the config's valid names and its error
messages are read from the registry, never listed again. Pure Python: configs are checked with registries before
Ray or torch load, so an entry that needs heavy modules imports them in its factory, not at registration.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from rlplace.core.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> entries of one kind; `key` is the config key that names an entry (e.g. `rollout.backend`)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, entry: T) -> T: ...
    def register(self, name: str, entry: T | None = None) -> T | Callable[[T], T]:
        """Add `entry` under `name` (also as a decorator: `@REGISTRY.register("name")`); a name is taken once."""

        def add(found: T) -> T:
            if name in self._entries and self._entries[name] is not found:
                raise ValueError(f"{self.key}: {name!r} is registered already")
            self._entries[name] = found
            return found

        return add if entry is None else add(entry)

    def __getitem__(self, name: str) -> T:
        """The entry of `name`; ConfigError in one line naming the key, the value and the valid names."""
        if name not in self._entries:
            raise ConfigError(f"{self.key} = {name!r} is invalid: valid: {', '.join(self.names())}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> tuple[tuple[str, T], ...]:
        return tuple(self._entries.items())

    def check(self, name: str) -> None:
        """Refuse a name that is not registered (ConfigError, as `__getitem__`)."""
        self[name]


@functools.cache
def load(path: str, key: str = "") -> Any:
    """The object `path` names as `package.module:attribute`, imported on first use and kept: how an entry whose code
    needs torch is registered in a light module and loaded only where it runs (every step, at a dict lookup's cost).
    ConfigError in one line (naming `key`, the config key that holds the path, when given) if it cannot be
    imported."""
    module_name, colon, attribute = path.partition(":")
    try:
        if not colon or not module_name or not attribute:
            raise ValueError("expected package.module:attribute")
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        where = f"{key} = " if key else ""
        raise ConfigError(f"{where}{path!r} cannot be imported ({type(error).__name__}: {error})") from None


@functools.cache
def load_file(path: str, attribute: str, key: str = "") -> Any:
    """The object `attribute` of the Python file `path` (a user's file that is not part of an installed package),
    which is executed once as a module of its own (named by a hash of its absolute path, so that two files of the same
    name do not collide) and kept in `sys.modules`. ConfigError in one line (naming `key`, as `load`) if the file is
    missing, fails to run, or lacks `attribute`."""
    file = Path(path).expanduser().absolute()
    where = f"{key} = {f'{path}:{attribute}'!r}" if key else repr(f"{path}:{attribute}")
    if not file.is_file():
        raise ConfigError(f"{where} cannot be loaded: no such file {str(file)!r}")
    name = f"_rlplace_file_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"
    module = sys.modules.get(name)
    try:
        if module is None:
            spec = importlib.util.spec_from_file_location(name, file)
            assert spec is not None and spec.loader is not None, "a .py file always has a source loader"
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return getattr(module, attribute)
    except (ImportError, AttributeError, SyntaxError, OSError) as error:
        raise ConfigError(f"{where} cannot be loaded ({type(error).__name__}: {error})") from None


def absolute(spec: str) -> str:
    """A `path/to/file.py:attribute` spec with the file's path made absolute (against the directory the run starts
    in), so that every worker loads the same file wherever it runs; other specs (names, `package.module:attribute`)
    unchanged."""
    path, colon, name = spec.rpartition(":")
    return f"{Path(path).expanduser().absolute()}:{name}" if colon and path.endswith(".py") else spec


def load_function(registry: Registry[T], spec: str, valid: str, what: str) -> T | Callable[..., Any]:
    """The function `spec` names for `registry`'s key (a reward, a tool): a registered name, `package.module:function`
    (`load`) or `path/to/file.py:function` (`load_file`). ConfigError in one line naming the key, the value and
    `valid` when it is none of them or cannot be loaded, or `what` a function of that key is when it is not
    callable."""
    key = registry.key
    if ":" not in spec:
        if spec not in registry:
            raise ConfigError(f"{key} = {spec!r} is invalid: {valid}")
        return registry[spec]
    path, _, name = spec.rpartition(":")
    try:
        found = load_file(path, name, key) if path.endswith(".py") else load(spec, key)
    except ConfigError as error:
        raise ConfigError(f"{error}; {valid}") from None
    if not callable(found):
        raise ConfigError(f"{key} = {spec!r} is not callable: {what}")
    return found
