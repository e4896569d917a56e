"""How XLA:GPU fuses each jax primitive of a traced step: into its readers, into a reduction, or as a kernel."""

# Operations XLA fuses into their readers (loop fusion); their outputs are buffers only when needed.
ELEMENTWISE = frozenset(
    """add add_any sub mul div neg max min abs sign exp exp2 log log1p expm1 tanh logistic erf erfc erf_inv sin
    cos tan sqrt rsqrt cbrt pow integer_pow square select_n convert_element_type eq ne lt le gt ge and or not xor
    shift_left shift_right_logical shift_right_arithmetic floor ceil round is_finite nextafter clamp iota
    broadcast_in_dim copy copy_p atan2 rem stop_gradient bitcast_convert_type reduce_precision pad concatenate
    slice dynamic_slice rev real imag threefry2x32 random_bits random_wrap random_unwrap random_seed
    random_fold_in random_split gather select_and_gather_add optimization_barrier mul_add logaddexp stack unstack
    split one_minus_square polynomial""".split()  # the last two: jax 0.12's (tanh's derivative, erf's series)
)
# Producers XLA does not duplicate into several readers (`InstructionFusion::IsExpensive`). Random bits are
# ~20 threefry rounds per element: a dropout mask is written once, not recomputed in the backward pass.
EXPENSIVE = frozenset(
    "log log1p expm1 tanh logistic erf erfc erf_inv sin cos tan pow atan2 cbrt lgamma digamma random_bits "
    "threefry2x32".split()
)
# Cheap on GPU in float32 (`GpuInstructionFusion::IsExpensive`). That list names float16 too, but XLA:GPU's compiled
# mixed_float16 steps keep a float16 softmax's exp for the backward as mixed_bfloat16's keep bfloat16's (RoBERTa's), and
# their figures are within 2% of mixed_bfloat16's on 64 of 80 rows: float16 counts as bfloat16 (docs/plan.md).
CHEAP_IN_F32 = frozenset("exp exp2 div sqrt rsqrt".split())
# Error functions whose 16-bit operand XLA:GPU writes out when other kernels read it too: an exact GELU in bfloat16
# (`jax.nn.gelu`: erfc(-x / sqrt 2), whose derivative reads that operand again) keeps -x / sqrt 2 as a third output of
# the fusion that computes the GELU, beside x and the erfc; in float32 it recomputes it from x. A cost-model choice:
# kept in the sharded steps compiled and on a real H100, recomputed by one cuBLAS-only compile (docs/plan.md).
ERROR_FUNCTIONS = frozenset("erf erfc".split())
# Reductions: their elementwise inputs fuse into them (input fusion); their output is a buffer.
REDUCTIONS = frozenset(
    """reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or argmax argmin reduce_window_sum
    reduce_window_max reduce_window_min reduce_window cumsum cumlogsumexp cummax cummin cumprod""".split()
)
ALIASES = frozenset("reshape squeeze expand_dims transpose".split())  # bitcasts after layout assignment
# Kernels XLA runs in place over their first operand when it is read for the last time (HloDataflowAnalysis's
# CanShareOperandBufferWithUser): an embedding's gradient is scattered into its zeros, not into a second table.
IN_PLACE_KERNELS = frozenset("scatter scatter-add scatter-sub scatter-mul scatter-min scatter-max".split())
# XLA:GPU takes a max pool's gradient as a reduce-window that finds each window's maximum again and a scatter, both
# fusions, which compute the pool's input from its roots (a padded normalization's output is not written out) unless
# it is a ReLU's output: that one is kept (docs/plan.md, "Max pools").
POOL_GRADIENT = "select_and_scatter_add"
# Everything else (dot_general, conv, custom calls, scatter, sort, loops, collectives) is a kernel of its own.
