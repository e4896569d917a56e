"""Rules for the variable naming of Keras core layers."""

from kdist.rules.rule import Rule, RuleSet

KERAS_CORE = RuleSet(
    [
        Rule(r"(.*/)?lora_kernel_[ab]", (), "LoRA adapters stay replicated"),
        Rule(
            r"(.*/)?(query|key|value)/kernel",
            [(None, "model", None), (None, None, "model"), ("...", "model")],
            "attention q/k/v: column-parallel over heads (head_dim if heads do not divide)",
        ),
        Rule(
            r"(.*/)?attention_output/kernel",
            [("model", None, None), (None, "model", None), ("model", "...")],
            "attention output: row-parallel over heads (head_dim if heads do not divide)",
        ),
        Rule(
            r"(.*/)?output/kernel",
            [("model", None, None), (None, "model", None), ("...", "model")],
            "output projection of heads (heads, head_dim, hidden): row-parallel over heads; 2-D: output features",
        ),
        Rule(r"(.*/)?embeddings", [("model", None), (None, "model")], "embedding table: vocabulary, else features"),
        Rule(
            r"(.*/)?reverse_embeddings",
            [(None, "model"), ("model", None)],
            "untied output embedding: vocabulary, else features",
        ),
        Rule(
            r"(.*/)?(depthwise_|pointwise_)?kernel",
            [("...", "model"), ("...", "model", None)],
            "Dense/EinsumDense/Conv kernels: output features (input features if those do not divide)",
        ),
        Rule(
            r"(.*/)?bias",
            (),
            "bias: its kernel's output split (replicated without a kernel)",
            follows=("kernel", "trailing"),
        ),
        Rule(
            r"(.*/)?(gamma|beta|scale|moving_mean|moving_variance|kernel_scale|seed_generator_state)",
            (),
            "normalization and small state: replicated",
        ),
    ],
    name="keras-core",
)
