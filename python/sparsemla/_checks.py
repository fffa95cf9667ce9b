"""Argument checks of the public Python entries, run before the extension sees an argument.

The extension validates dtypes, shapes, strides and devices with errors naming the argument; what
it cannot word well is what nanobind rejects while converting a call (a read-only array, an int
beyond the C type, a float or a list where an int or an array goes) and what the Python layer
reads itself (``q.shape[1]`` of a 1-D q). Those are checked here, with the library's wording:
``sparsemla::<op>: argument '<name>': expected <what>, got <value>``, raised as
:class:`sparsemla.Error` (a ValueError) for a bad value and as TypeError for a wrong Python type.
"""

import math
import numbers

import numpy as np

from . import _C

I32_MAX = 2 ** 31 - 1
I64_MAX = 2 ** 63 - 1


def _text(op, name, expected, got):
    return f"sparsemla::{op}: argument '{name}': expected {expected}, got {got}"


def fail(op, name, expected, got):
    raise _C.Error(_text(op, name, expected, got))


def fail_type(op, name, expected, got):
    raise TypeError(_text(op, name, expected, got))


def _type_name(x):
    return "None" if x is None else type(x).__name__


def is_array(x):
    """numpy arrays, torch tensors and anything exporting DLPack or the array interface."""
    return (isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")
            or hasattr(x, "__array_interface__"))


def array(op, name, x, *, ndim=None, optional=False, writable=False):
    """x is an array (or None when optional), of `ndim` dimensions (an int or a tuple of them),
    writable when the call writes into it. Returns x."""
    if x is None and optional:
        return x
    if not is_array(x):
        fail_type(op, name, "a numpy array or a torch tensor" + (" or None" if optional else ""),
                  _type_name(x))
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if len(x.shape) not in allowed:
            dims = (f"{allowed[0]}..{allowed[-1]}" if len(allowed) > 2
                    else " or ".join(str(n) for n in allowed))
            fail(op, name, f"a {dims}-D array", f"{len(x.shape)}-D, shape {tuple(x.shape)}")
    if writable and isinstance(x, np.ndarray) and not x.flags.writeable:
        fail(op, name, "a writable array (the call writes into it)", "a read-only array")
    return x


def integer(op, name, v, lo=0, hi=I64_MAX, *, optional=False):
    """v is an integer (a Python or numpy int, not a bool or a float) in [lo, hi]; returns int(v).
    None passes through when optional."""
    if v is None and optional:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        fail_type(op, name, "an integer" + (" or None" if optional else ""),
                  f"{_type_name(v)} {v!r}")
    v = int(v)
    if not lo <= v <= hi:
        fail(op, name, f"an integer in [{lo}, {hi}]", str(v))
    return v


def flag(op, name, v):
    """v is a bool (or the ints 0/1 torch ops and configs carry); returns bool(v)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, numbers.Integral) and int(v) in (0, 1):
        return bool(v)
    fail_type(op, name, "a bool", f"{_type_name(v)} {v!r}")


def real(op, name, v, *, finite=True, positive=False):
    """v is a real number (not a bool), finite when asked, > 0 when asked; returns float(v)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        fail_type(op, name, "a real number", f"{_type_name(v)} {v!r}")
    v = float(v)
    if finite and not math.isfinite(v):
        fail(op, name, "a finite number", repr(v))
    if positive and not v > 0:
        fail(op, name, "a number > 0", repr(v))
    return v


def text(op, name, v, choices=None):
    """v is a str (one of `choices` when given); returns v."""
    if not isinstance(v, str):
        fail_type(op, name, "a str", f"{_type_name(v)} {v!r}")
    if choices is not None and v not in choices:
        fail(op, name, " or ".join(repr(c) for c in choices), repr(v))
    return v


PATHS = ("auto", "cpu", "cuda-generic", "cuda-sm90")


def path(op, v):
    """A path name (see PATHS); returns v."""
    return text(op, "path", v, PATHS)


def block_size(op, name, v):
    """A page size: None (taken from the cache's shape[1]) or an int in [1, 2^31-1]; returns the
    int the extension takes (0 for None)."""
    v = integer(op, name, v, 1, I32_MAX, optional=True)
    return 0 if v is None else v


def out_pair(op, out):
    """A builder's out=(indices, indptr): None, or a pair of writable 1-D arrays."""
    if out is None:
        return None
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        fail_type(op, "out", "a pair (indices, indptr) of int32 arrays or None", _type_name(out))
    array(op, "out_indices", out[0], ndim=1, writable=True)
    array(op, "out_indptr", out[1], ndim=1, writable=True)
    return out


def is_numpy_bf16(x):
    """A numpy array of ml_dtypes' bfloat16 (numpy itself has no bf16 dtype)."""
    return isinstance(x, np.ndarray) and x.dtype.name == "bfloat16" and x.dtype.itemsize == 2
