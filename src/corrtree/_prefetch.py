"""A software prefetch for numba kernels (LLVM's ``llvm.prefetch`` intrinsic).

The lazy and kernel trainers read ``G[i, j]`` at scattered positions, and each neuron's
pairs from a segment of the pool's arrays that the hardware's stream prefetchers do not
foresee (segments of consecutive neurons lie apart); asking for the next neuron's
entries while computing the current one keeps several cache misses in flight.
"""

from __future__ import annotations

from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["prefetch1d", "prefetch2d"]

# LLVM 15 and later name the intrinsic by its opaque pointer type.
_NAME = "llvm.prefetch.p0" if binding.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


def _prefetch_codegen(context, builder, signature, args):
    """Emit ``llvm.prefetch`` for the address of ``args[0][args[1:]]``."""
    aryty = signature.args[0]
    ary = context.make_array(aryty)(context, builder, args[0])
    idx = [
        context.cast(builder, v, t, types.intp)
        for v, t in zip(args[1:], signature.args[1:], strict=True)
    ]
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx)
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, _NAME)
    # read access, high temporal locality, data cache
    builder.call(
        fn,
        [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)],
    )
    return context.get_dummy_value()


@intrinsic
def prefetch2d(typingctx, arr, i, j):
    """Hint that ``arr[i, j]`` will be read soon (no effect on results)."""
    return types.void(arr, i, j), _prefetch_codegen


@intrinsic
def prefetch1d(typingctx, arr, i):
    """Hint that ``arr[i]`` will be read soon (no effect on results)."""
    return types.void(arr, i), _prefetch_codegen
