"""How a traced value lies in device memory: row-major as the value it is computed from, seen through layouts.

XLA gives a value its operand's layout through transposes (a layout
change, not a kernel, after layout assignment), elementwise operations and
casts, and row-major order where a kernel writes it. `layouts` decides from
this where a batched product reads a value in another order;
`column_reductions` which reductions sum a dimension that is not innermost.
"""

from kdist.planning.primitives import ELEMENTWISE


def lies(x, f, producer):
    """x's dimensions, outermost first, as the value it is computed from lies (row-major), followed back through
    transposes (layouts), casts and elementwise operations of its shape (which keep their operand's layout)."""
    perm, value = list(range(len(f.shape[x]))), x
    while value in producer:
        j = producer[value]
        prim, ins, _ = f.eqns[j]
        if prim == "transpose":
            perm, value = [f.params[j][d] for d in perm], ins[0]
            continue
        same = [
            v
            for v in ins
            if f.shape[v] == f.shape[value]
            and (f.dtype[v] == f.dtype[value] or prim == "convert_element_type")
            and not broadcast(v, f, producer)
        ]
        if prim not in ELEMENTWISE or prim == "broadcast_in_dim" or not same:
            break
        value = same[0]
    return tuple(sorted(range(len(perm)), key=lambda d: perm[d]))


def broadcast(v, f, producer):
    """Whether value v is made by a broadcast (its layout is its reader's)."""
    return v in producer and f.eqns[producer[v]][0] == "broadcast_in_dim"
