"""PassContext: the settings every pass reads — optimization level, passes forced on or off,
typed configuration, and the instruments that watch passes run.

Contexts nest as a stack (``with PassContext(...):``); code outside any ``with`` sees a default
context. One default level, :data:`DEFAULT_OPT_LEVEL` (3), and one rule: every pass, pipeline
and ``opf.compile`` runs at the level of the current context, and ``PassContext()`` without an
``opt_level`` is at the default level. (TVM's PassContext defaults to 2 and TVM users wrap
``relay.build`` in ``PassContext(opt_level=3)``; opfusion makes that common case the default,
so ``opf.compile(mod)`` folds scales, eliminates common subexpressions and fuses as TVM does at
level 3.) Configuration keys are declared once, next to the pass that reads them,
with :func:`register_pass_config`; a context built with an unknown key or a value of the wrong
type is rejected on the spot, with the closest known key suggested."""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import OpfusionError

if TYPE_CHECKING:
    from .instrument import PassInstrument
    from .pass_infra import PassInfo


@dataclass(frozen=True)
class ConfigOption:
    """One declared configuration key: its type, default and meaning."""

    key: str
    type: type
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    #: Called with a value of the right type; raises OpfusionError for a value it refuses
    #: (for choices that can grow, like the registered fusion strategies).
    validate: Callable[[Any], Any] | None = None


_CONFIG_OPTIONS: dict[str, ConfigOption] = {}


def register_pass_config(key: str, value_type: type, default: Any, doc: str,
                         choices: Sequence[Any] | None = None,
                         validate: Callable[[Any], Any] | None = None) -> ConfigOption:
    """Declare the configuration key ``key`` (e.g. ``"FuseOps.max_depth"``). ``choices``
    fixes the values it takes; ``validate``, called with each value, refuses a value by
    raising OpfusionError.

    Declaring the same key twice with the same type is allowed (module reloads); a second
    declaration with another type is a programming error."""
    option = ConfigOption(key, value_type, default, doc, tuple(choices) if choices else None,
                          validate)
    known = _CONFIG_OPTIONS.get(key)
    if known is not None and known.type is not value_type:
        raise OpfusionError(f"pass config {key!r} is already declared with type "
                            f"{known.type.__name__}")
    _CONFIG_OPTIONS[key] = option
    return option


def list_pass_configs() -> dict[str, ConfigOption]:
    """Every declared configuration key, in declaration order."""
    return dict(_CONFIG_OPTIONS)


def _check_config_value(key: str, value: Any) -> Any:
    option = _CONFIG_OPTIONS.get(key)
    if option is None:
        close = difflib.get_close_matches(key, list(_CONFIG_OPTIONS), n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(_CONFIG_OPTIONS)) or "none"
        raise OpfusionError(f"unknown pass config key {key!r}{hint} (known keys: {known})")
    wanted = option.type
    # bool is an int in Python; a config that wants an int must not silently take True.
    ok = isinstance(value, wanted) and not (wanted is int and isinstance(value, bool))
    if wanted is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise OpfusionError(f"pass config {key!r} takes a {wanted.__name__}, got "
                            f"{type(value).__name__} {value!r}")
    if option.choices is not None and value not in option.choices:
        choices = ", ".join(map(repr, option.choices))
        raise OpfusionError(f"pass config {key!r} must be one of {choices}, got {value!r}")
    if option.validate is not None:
        option.validate(value)
    return value


#: The optimization level of a PassContext built without one, and so of the context code
#: outside any ``with PassContext`` sees (``opf.compile``, ``optimize``, ``FuseOps()``).
DEFAULT_OPT_LEVEL = 3


class PassContext:
    """The settings passes run under.

    ``opt_level``: passes whose declared level is higher are skipped by :class:`Sequential`
    (unless named in ``required_pass``); ``disabled_pass``: names never run by a Sequential;
    ``config``: values for declared keys (see :func:`list_pass_configs`); ``instruments``:
    :class:`PassInstrument` objects notified around every pass."""

    _local = threading.local()

    def __init__(self, opt_level: int = DEFAULT_OPT_LEVEL, required_pass: Iterable[str] = (),
                 disabled_pass: Iterable[str] = (), config: Mapping[str, Any] | None = None,
                 instruments: Sequence[PassInstrument] = ()) -> None:
        if not isinstance(opt_level, int) or isinstance(opt_level, bool) or opt_level < 0:
            raise OpfusionError(f"PassContext opt_level must be an int >= 0, got {opt_level!r}")
        self.opt_level = opt_level
        self.required_pass = tuple(_names(required_pass, "required_pass"))
        self.disabled_pass = tuple(_names(disabled_pass, "disabled_pass"))
        self.config = {key: _check_config_value(key, value)
                       for key, value in (config or {}).items()}
        self.instruments = list(instruments)

    # -- the context stack -------------------------------------------------------------------
    @classmethod
    def current(cls) -> PassContext:
        """The innermost active context (a default one when no ``with`` is active)."""
        stack = cls._stack()
        return stack[-1]

    @classmethod
    def _stack(cls) -> list[PassContext]:
        stack = getattr(cls._local, "stack", None)
        if stack is None:
            stack = cls._local.stack = [PassContext()]
        return stack

    def __enter__(self) -> PassContext:
        for instrument in self._new_instruments():
            instrument.enter_pass_ctx()
        self._stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = self._stack()
        if stack and stack[-1] is self:
            stack.pop()
        for instrument in self._new_instruments():
            instrument.exit_pass_ctx()

    def _new_instruments(self) -> list[PassInstrument]:
        # An inner context that inherits instruments (``with_opt_level``) must not restart
        # them: only instruments no outer context holds are entered and exited here.
        outer = [inst for ctx in self._stack() if ctx is not self for inst in ctx.instruments]
        return [inst for inst in self.instruments if not any(inst is o for o in outer)]

    # -- queries -----------------------------------------------------------------------------
    def get_config(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` in this context, else its declared default.

        ``default`` overrides the declared default (for keys declared by optional parts)."""
        if key in self.config:
            return self.config[key]
        option = _CONFIG_OPTIONS.get(key)
        if option is None:
            _check_config_value(key, None)  # raises with a suggestion
        return option.default if default is None else default

    def pass_enabled(self, info: PassInfo) -> bool:
        """Whether a Sequential runs the pass described by ``info`` in this context."""
        if info.name in self.disabled_pass:
            return False
        if info.name in self.required_pass:
            return True
        return info.opt_level <= self.opt_level

    def with_opt_level(self, opt_level: int) -> PassContext:
        """A copy of this context at another optimization level (same config, instruments)."""
        return PassContext(opt_level, self.required_pass, self.disabled_pass, self.config,
                           self.instruments)

    def __repr__(self) -> str:
        return (f"PassContext(opt_level={self.opt_level}, required_pass={self.required_pass}, "
                f"disabled_pass={self.disabled_pass}, config={self.config})")


def _names(values: Iterable[str], what: str) -> list[str]:
    if isinstance(values, str):
        values = [values]
    out = []
    for value in values:
        if not isinstance(value, str):
            raise OpfusionError(f"PassContext {what} takes pass names, got {value!r}")
        out.append(value)
    return out
