"""How a convolution carries its operands' model-axis splits: its output's split, the input it gathers, and
whether it makes a partial sum (the convolution rules of `kdist.planning.propagation`).

XLA's SPMD partitioner convolves each device's part where the operands'
splits allow it: an input split on the channels a kernel reads whole is
gathered first; a kernel split on the channels it contracts makes a partial
sum; a grouped (depthwise) convolution convolves each device's own groups.
"""


def output_split(dimension_numbers, operands):
    """A kernel's split output features split the output's features; the input's batch split stays."""
    lhs, rhs = operands[0], operands[1] if len(operands) > 1 else {}
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    out = {a: out_spec[1] for a, d in rhs.items() if d == rhs_spec[0]}
    for a, d in lhs.items():
        if d == lhs_spec[0]:
            out.setdefault(a, out_spec[0])
    return out


def gathered_inputs(dimension_numbers, operands, shapes):
    """Per operand of a convolution: the axes its input is gathered over (features split, the kernel's not).

    A grouped convolution (a depthwise one: the input has more features than
    the kernel reads per group) keeps an input split that its kernel's output
    features share: each device convolves its own groups.
    """
    lhs_spec, rhs_spec, _ = dimension_numbers
    lhs, rhs = operands[0], operands[1] if len(operands) > 1 else {}
    kernel_dim = rhs_spec[0] if _grouped(dimension_numbers, shapes) else rhs_spec[1]
    return [{a for a, d in lhs.items() if d == lhs_spec[1] and rhs.get(a) != kernel_dim}, set()]


def partial_sum(dimension_numbers, operands, shapes):
    """Whether a convolution's output is a partial sum: its kernel split on the input features it contracts, the
    input split alike or whole (each device then reads its slice).
    """
    lhs_spec, rhs_spec, _ = dimension_numbers
    lhs, rhs = operands[0], operands[1] if len(operands) > 1 else {}
    contracted = any(d == rhs_spec[1] and lhs.get(a, lhs_spec[1]) == lhs_spec[1] for a, d in rhs.items())
    return contracted and not _grouped(dimension_numbers, shapes)


def _grouped(dimension_numbers, shapes):
    """Whether a convolution is grouped: its input has more features than its kernel reads (depthwise)."""
    lhs_spec, rhs_spec, _ = dimension_numbers
    return shapes[0][lhs_spec[1]] != shapes[1][rhs_spec[1]]
