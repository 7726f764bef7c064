"""_errors.py: the exceptions kiln raises."""


class KilnError(RuntimeError):
    """A kiln failure: the message is kiln's own (a runtime status and what
    failed, or the compiler's located error)."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status  # "KILN_ERROR_..." for the runtime's failures


class CompileError(KilnError):
    """kiln compile refused the model: the message is its located error
    ("model.onnx: error: node 'n (Slice)': ...")."""

    def __init__(self, message, returncode=1):
        super().__init__(message)
        self.returncode = returncode
