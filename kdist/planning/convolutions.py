"""What XLA:GPU adds to a convolutional step: its max pools' gradients and its kernels' filter-layout copies.

Both are buffers of `timeline.Step` that no traced value is: XLA:GPU's own
way of running a max pool's gradient, and the transposed copies of the
convolution kernels cuDNN reads (docs/plan.md, "Max pools" and
"Convolutional steps").
"""

import math

from kdist.units import itemsize

# When a max pool gradient's indices are made (`Step.overlapped`, chosen per mesh by `memory_model._pool_orders`): with
# the pool's own backward, at the start of the backward, or right after the backward's first max pool gradient.
LATE, EARLY, AFTER_FIRST_POOL = 0, 1, 2


def max_pool_gradient(step, made, shape, pooled, forward_start):
    """The extra buffers of a max pool's gradient in `step`: its pooled cotangent, of `shape`, scattered into
    `made`, the gradient of input `pooled`, whose pool's forward ran from event `forward_start`.

    XLA:GPU finds each window's maximum again, a reduce-window writing one
    int32 index per dimension of `shape` beside the maxima themselves (the
    pool's dtype; nothing reads them, they exist while it runs), then
    scatters into zeros of the input's shape. The indices read only
    forward values: where a collective runs in the backward before the
    pool's (a model axis's, a combined reduction of weight gradients),
    XLA's latency-hiding scheduler computes them early to overlap it
    (DenseNet121 and InceptionV3 on data=8: 400-600 instructions before the
    pool's own backward); on one device, or where every gradient is reduced
    after it (a small CNN, ResNet50 on fsdp=16), just before it
    (`memory_model._pool_orders`). Where a data axis all-reduces the
    gradients at the end, XLA computes every other pool's indices right
    after the backward's first max pool gradient (keras-hub's VGG and a
    three-pool toy on data=8, docs/plan.md "A ReLU before a max pool").
    The zeros come with them, unless
    the pool reads a ReLU's output: then XLA merges them with the zeros
    the ReLU compares with (one broadcast, written out as two buffers),
    made in the forward and alive until the backward (docs/plan.md, "Max
    pools"). Returns (made, read, may write over).
    """
    pool = len(step.events)  # the pool's backward is the next event
    earlier = sorted({p for _, p in step.overlapped.values()})  # the pools the backward took before this one
    dtype = step.dtype[made[0]] if made else "float32"  # the pool's, as its input's gradient
    # every earlier pool but the first made its indices after the first's, one kernel each
    at = {LATE: pool, EARLY: step.bwd_start, AFTER_FIRST_POOL: earlier[0] + len(earlier) if earlier else pool}
    made_here, read, written = [], [], []
    for when in (LATE, EARLY) + ((AFTER_FIRST_POOL,) if earlier else ()):
        indices = step.new(math.prod(shape) * 4 * len(shape), shape, "backward", "int32")
        maxima = step.new(math.prod(shape) * itemsize(dtype), shape, "backward", dtype)
        step.overlapped.update({indices: (when, pool), maxima: (when, pool)})
        if at[when] < pool:  # made before, read by the pool's gradient
            step.events[at[when]][0].extend((indices, maxima))
            read.append(indices)
        else:
            made_here += [indices, maxima]
        written += [indices, maxima]
    zeros = []
    if made:
        gradient, shared = made[0], pooled in step.relu_outputs  # shared: one broadcast with the ReLU's zeros
        zeros = [step.new(step.size[gradient], step.shape[gradient], "backward", step.dtype[gradient])
                 for _ in range(1 + shared)]  # fmt: skip
        step.overlapped.update({} if shared else {zeros[0]: (EARLY, pool)})
        step.events[forward_start if shared else step.bwd_start][0].extend(zeros)
        for g in (*written, *zeros):  # split over the model axis as the gradient is
            step.derived[g] = gradient
    return [*made, *made_here], (*read, *zeros), tuple(zeros[:1])


def note_kernel_reads(step, kernel, backward, window):
    """Record that the last event of `step`, a convolution, reads buffers `kernel` as its kernel: the weights among
    them, and their copies (`step.conv_kernels`, for `add_kernel_copies`); those of a window of more than one
    element (`window`: the kernel's spatial size), whose input gradient reads them flipped, in
    `step.windowed_kernels` (`Step._add_gathers`)."""
    for w in kernel:
        var = step.weight_of.get(w)
        if var is not None:
            if window > 1:
                step.windowed_kernels.add(var)
            reads = step.conv_kernels.setdefault(var, [None, []])
            if step.term[w] == "external" and not backward:  # the forward reads the variable itself
                reads[0] = w
            reads[1].append(len(step.events) - 1)


def add_kernel_copies(step):
    """On a GPU target, each convolution kernel's copy in cuDNN's filter layout, made by the first convolution
    of `step` that reads the kernel and kept until the last (its input gradient's, in the backward).

    XLA:GPU lays a convolution's filter out output-channels first (OHWI
    beside NHWC activations), while the variable is HWIO: it transposes the
    kernel into a copy before the forward convolution, and the backward's
    input gradient reads that copy (`xla_buffers_at_peak.py`: ResNet50 on
    one deviceless H100, 75 MB of copies alive at XLA's peak, all made
    before the forward's first convolution; VGG19 on data=8, 71 MB, each
    made just before its convolution; docs/plan.md, "Convolutional steps").
    The copy is of the kernel as one device holds it.
    """
    if step.rules.platform != "gpu" or not step.conv_kernels or not step.events:
        return
    events = [(list(m), list(u), ip) for m, u, ip in step.events]
    for var, (w, times) in step.conv_kernels.items():
        if w is None:  # the forward reads a copy already (mixed precision's cast, kept for the backward)
            continue
        copy = step.new(step.var_bytes[var], step.shape[w], "activations", step.dtype[w])
        step.weight_of[copy], step.batch[copy] = var, False  # a weight's size: its shard's on a mesh
        events[min(times)][0].append(copy)
        events[max(times)][1].append(copy)
    step.events = [(m, tuple(u), ip) for m, u, ip in events]
