"""The exceptions opfusion raises for a user's mistake.

Every message says what went wrong, where (node, op, attribute or input) and what to do.
Internal invariants may still assert; those are bugs, not user errors."""

from __future__ import annotations


class OpfusionError(Exception):
    """Base class of every error opfusion raises on bad input."""


class OpfusionTypeError(OpfusionError):
    """Type inference failed: shapes or dtypes that an operator cannot accept."""


class OpAttributeError(OpfusionError):
    """An operator attribute is missing, unknown or has a bad value."""


class UnknownOpError(OpfusionError):
    """An operator name that is not declared in opfusion.opdefs."""


class ParseError(OpfusionError):
    """The text IR could not be parsed; the message gives line, column and what was expected."""

    def __init__(self, message: str, line: int, column: int, source_line: str = "") -> None:
        self.line = line
        self.column = column
        pointer = ""
        if source_line:
            pointer = f"\n  {source_line}\n  {' ' * max(column - 1, 0)}^"
        super().__init__(f"line {line}, column {column}: {message}{pointer}")


class EvaluationError(OpfusionError):
    """The reference interpreter was given inputs it cannot run (missing, wrong shape or dtype)."""


class DeviceError(OpfusionError):
    """A device that opfusion does not know, or cannot run kernels on yet (e.g. "cuda")."""


class BuildError(OpfusionError):
    """A kernel could not be built: unsupported target, or IR the code generator cannot emit."""


class CompilerNotFoundError(BuildError):
    """No C compiler was found ($CC, cc, gcc, clang); install gcc or set CC."""


class CompileError(BuildError):
    """The C compiler rejected generated source. The message sums it up (the source's path,
    the first errors and their count); ``compiler_output`` is the compiler's whole output,
    ``command`` the command line that failed and ``source_path`` the whole source."""

    def __init__(self, message: str, source_path: str = "", compiler_output: str = "",
                 command: str = "") -> None:
        self.source_path = source_path
        self.compiler_output = compiler_output
        self.command = command
        super().__init__(message)


class KernelArgumentError(OpfusionError):
    """A compiled kernel was called with the wrong number, shape, dtype or layout of arguments."""


class TensorExprError(OpfusionError):
    """A tensor expression (te.placeholder, te.compute, a scalar expression) is malformed."""


class ScheduleError(OpfusionError):
    """A schedule primitive was asked for something illegal; the message names stage and var."""


class LoweringError(OpfusionError):
    """A schedule could not be lowered to loop IR (bad args, an impossible attachment, ...)."""


class OnnxImportError(OpfusionError):
    """An ONNX model could not be imported: a malformed tensor, name, opset or external data
    reference, or a node that failed to convert; the message names the node or tensor."""


class DataDependentError(OnnxImportError):
    """A node needs at import a value the model computes at run time (a Reshape's shape, a
    NonZero's input, a Loop's trip count): its result's shape depends on data. ``node`` names
    the ONNX node, ``input_index`` the input it needs. ``opf.compile`` of an ONNX model runs
    such models in stages (:mod:`opfusion.compiler.staged`)."""

    def __init__(self, message: str, node: str | None = None,
                 input_index: int | None = None) -> None:
        super().__init__(message)
        self.node = node
        self.input_index = input_index
        #: The needed value's name in the graph, where the importer knows it.
        self.value_name: str | None = None
        #: The index of the model's top-level node being converted (set by the importer).
        self.graph_index: int | None = None


class TorchImportError(OpfusionError):
    """A PyTorch model could not be imported: an ATen node that failed to convert, a dtype or
    an input opfusion cannot hold; the message names the node and its source line."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node  # the FX node's name, so a caller can run that node elsewhere


class ResourceLimitError(OpfusionError):
    """A model would need more work or memory than the compile limits allow (a kernel's loop
    iterations, one allocation, the executor's memory plan). The message names the kernel or
    value, the estimate and the ``PassContext`` config key that raises the limit."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped early on Ctrl-C (SIGINT): its kernels returned without finishing (see
    :mod:`opfusion.runtime.interrupt`). A KeyboardInterrupt, not an OpfusionError, so that
    ``except Exception`` does not swallow it; the executor stays usable."""


class IndexOutOfRangeError(EvaluationError):
    """An index input (take, gather_elements, check_indices) held a value outside the axis it
    indexes; the message names the op, the index, its position and the allowed range."""


class OutOfMemoryError(OpfusionError, MemoryError):
    """The machine did not give memory that a run asked for (a block of the executor's memory
    plan, a result, a kernel's scratch), though within the compile limits: other processes
    hold it. The message names the value or kernel and the bytes. Also a MemoryError, so
    code that catches that keeps working."""
