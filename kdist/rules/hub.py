"""Layout rules for keras-hub backbones, one rule set per family.

The rules follow Megatron-style pairing: attention query/key/value and MLP
up/gate kernels are column-parallel (output features or heads on "model"),
attention output and MLP down kernels are row-parallel (input features or
heads on "model"), so each block needs one all-reduce per sublayer. On top of
what keras-hub's own `get_layout_map` covers they shard the untied output
embedding (`reverse_embeddings`), put mixture-of-experts weights on the
"expert" axis (the "model" axis when the mesh has none), fall back to
head_dim, then hidden, for key/value kernels whose head count does not divide
the model axis (the placement says so), let biases follow their kernel's
output split, and replicate LoRA adapters (unless asked: `with_lora`) and
norms with explicit rules.

Each family set matches only keras-hub's variable paths for that family, so
`AUTO` (every family, then the Keras core rules as the catch-all) picks the
right rules from the paths alone. Rules that several families share verbatim
appear once in `AUTO`, tagged with all of them.

Example:

```python
import kdist, keras, keras_hub
keras.distribution.set_distribution(kdist.preset("2x4"))     # rules="auto"
backbone = keras_hub.models.LlamaBackbone(...)               # sharded by the "llama" rules
dist = keras.distribution.distribution()
dist.placements["transformer_layer_0/self_attention/query/kernel"].rule.family
```
"""

import dataclasses

from kdist.rules.rule import Rule, RuleSet

ANY = r"(?:.*/)?"  # any enclosing model or layer names before the pattern

# Candidate layouts, by the part a weight plays; the first that divides wins.
VOCAB = [("model", None), (None, "model")]  # (vocabulary, hidden)
VOCAB_OUT = [(None, "model"), ("model", None)]  # (hidden, vocabulary)
FEATURES = [("...", "model")]  # position tables, class tokens, patch convolutions: (..., hidden)
COLUMN = [("...", "model"), ("model", "...")]  # (input, output): output features
ROW = [("model", "..."), ("...", "model")]  # (input, output): input features
HEADS_IN = [(None, "model", "..."), (None, None, "model"), ("model", "...")]  # (hidden, heads, head_dim)
HEADS_FIRST_IN = [("model", "..."), (None, None, "model"), (None, "model", None)]  # (heads, hidden, head_dim)
HEADS_OUT = [("model", "..."), (None, "model", "..."), ("...", "model")]  # (heads, head_dim, hidden)
EXPERT_COLUMN = [("expert", None, "model"), ("model", None, None), (None, None, "model")]  # (experts, hidden, inner)
EXPERT_ROW = [("expert", "model", None), ("model", None, None), (None, "model", None)]  # (experts, inner, hidden)
REPLICATED = ()

_QKV_NOTE = "attention q/k/v: column-parallel over heads (head_dim, then hidden, when the heads do not divide)"
_OUT_NOTE = "attention output: row-parallel over heads (input features of a 2-D kernel)"


def _rule(pattern, layouts, note, follows=(), fsdp_dim=None):
    return Rule(ANY + pattern, layouts, note, follows=follows, fsdp_dim=fsdp_dim)


def attention(scope, names=("query", "key", "value"), output="attention_output", heads_first=False):
    """Rules for an attention layer at `scope` (a regex) with q/k/v sublayers `names`."""
    qkv = _rule(f"{scope}/({'|'.join(names)})/kernel", HEADS_FIRST_IN if heads_first else HEADS_IN, _QKV_NOTE)
    return [qkv, _rule(f"{scope}/{output}/kernel", HEADS_OUT, _OUT_NOTE)]


def mlp(up, down):
    """Rules for an MLP whose up/gate kernels match `up` and down kernels match `down` (regexes)."""
    return [
        _rule(f"{up}/kernel", COLUMN, "MLP up/gate: column-parallel (output features)"),
        _rule(f"{down}/kernel", ROW, "MLP down: row-parallel (input features)"),
    ]


def experts(scope, up, down, router):
    """Rules for mixture-of-experts weights (experts, in, out) and their router.

    Under fsdp the expert kernels are split on their hidden dimension: on the
    inner one, XLA:GPU gathers the tokens of every device for the expert
    products instead of the weights (docs/plan.md, Limits, "Mixture-of-experts
    layers under fsdp").
    """
    fsdp = "; fsdp on the hidden size"
    return [
        _rule(
            f"{scope}/{up}",
            EXPERT_COLUMN,
            "MoE up/gate: experts on 'expert' (else 'model'), inner features on 'model'" + fsdp,
            fsdp_dim=1,
        ),
        _rule(
            f"{scope}/{down}",
            EXPERT_ROW,
            "MoE down: experts on 'expert' (else 'model'), inner features on 'model'" + fsdp,
            fsdp_dim=2,
        ),
        _rule(f"{router}/kernel", REPLICATED, "MoE router: replicated (small; every token scores every expert)"),
    ]


def replicated(pattern, note):
    return _rule(pattern, REPLICATED, note)


LORA = replicated(r"[^/]+/lora_kernel_[ab]", "LoRA adapters: replicated (lora=True shards them like their kernel)")
NORMS = replicated(r"[^/]*(norm|ln)[^/]*/(scale|gamma|beta|weight)", "normalization: replicated")
BIASES = [
    _rule("bias", REPLICATED, "bias: its kernel's output split (replicated without a kernel)", ("kernel", "trailing")),
    replicated(r"[^/]+_bias", "named biases: replicated"),
]
TOKENS = [
    _rule(
        "token_embedding/embeddings", VOCAB, "token embedding: vocabulary on 'model' (hidden when it does not divide)"
    ),
    _rule("token_embedding/reverse_embeddings", VOCAB_OUT, "untied output embedding: vocabulary on 'model'"),
]
TABLES = _rule(r"[^/]*(position|segment)_embedding/embeddings", FEATURES, "position/segment table: hidden on 'model'")

# Naming conventions that several families share.
LLAMA_ATTENTION = attention(r"transformer_layer_\d+/self_attention")
FEEDFORWARD = mlp("feedforward_(intermediate|gate)_dense", "feedforward_output_dense")
LLAMA = [*LLAMA_ATTENTION, *FEEDFORWARD]
ENCODER_ATTENTION = attention(r"[a-z0-9_]*layer_\d+/self_attention_layer")
DECODER_ATTENTION = attention(r"transformer_decoder_layer_\d+/(self_attention|cross_attention)")
BERT = [*ENCODER_ATTENTION, *FEEDFORWARD, TABLES, _rule("pooled_dense/kernel", COLUMN, "pooler: column-parallel")]
EMBEDDING_PROJECTION = _rule("embeddings?_projection/kernel", COLUMN, "embedding projection: column-parallel")
GEMMA = [
    *attention(r"decoder_block_\d+/attention", heads_first=True),
    *mlp(r"decoder_block_\d+/ffw_gating(_2)?", r"decoder_block_\d+/ffw_linear"),
]
VIT_BLOCK = attention(r"transformer_block_\d+/mha")
PATCHES = _rule(
    r"[^/]*patch_embeddings?(/projection)?/kernel", FEATURES, "patch convolution: output features on 'model'"
)
VISION_TOKENS = _rule(
    r"[^/]*embeddings?/(class_token|distillation_token|position_embedding|class_embedding|cls_token|mask_token|"
    r"position_embeddings|interpolated_position_embeddings)",
    FEATURES,
    "class/position tokens: hidden on 'model'",
)
POSITION_IDS = replicated(r"embedding/position_ids", "position ids: an integer buffer, replicated")
CLIP_BLOCK = [
    *attention(r"encoder_block_\d+/attention"),
    *mlp(r"encoder_block_\d+/dense_1", r"encoder_block_\d+/dense_2"),
]
SIGLIP_BLOCK = [
    *attention(r"(encoder_block_\d+/self_attn|head/attention)"),
    *mlp(r"(encoder_block_\d+|head)/mlp/fc1", r"(encoder_block_\d+|head)/mlp/fc2"),
]
CONTRASTIVE_HEAD = [
    _rule(r"(vision_projection|text_projection|head)/kernel", COLUMN, "projection head: column-parallel"),
    replicated(r"(clip|siglip)_head/logit_scale", "logit scale: a scalar, replicated"),
    _rule(r"head/variable", FEATURES, "attention-pooling probe: hidden on 'model'"),
]
GATED_DELTANET = [  # Qwen3.5's linear attention layers
    _rule(r"linear_attn/in_proj_(qkv|z|b|a)/kernel", COLUMN, "linear attention in-projections: column-parallel"),
    _rule(r"linear_attn/conv1d_kernel", [("model", None)], "linear attention convolution: channels, like in_proj_qkv"),
    _rule(r"linear_attn/out_proj/kernel", ROW, "linear attention output: row-parallel (input features)"),
    replicated(r"linear_attn/(A_log|dt_bias)", "linear attention decay per head: small, replicated"),
]
QWEN3_5 = [*TOKENS, *LLAMA, *GATED_DELTANET]
QWEN_MOE = experts(
    r"qwen_sparse_moe_block(_\d+)?/experts",
    "expert_feedforward_gate_dense",
    "expert_feedforward_output_dense",
    r"qwen_sparse_moe_block(_\d+)?/(sparse_feedforward_gate_dense|shared_expert_gate_dense)",
)


def _family(name, *rules):
    """A family's rule set: LoRA first, the family's rules, then norms and biases."""
    tagged = [dataclasses.replace(r, family=name) for r in (LORA, *rules, NORMS, *BIASES)]
    return RuleSet(tagged, name=name)


FAMILIES = {
    "llama": _family("llama", *TOKENS, *LLAMA),
    "llama3": _family("llama3", *TOKENS, *LLAMA),
    "mistral": _family("mistral", *TOKENS, *LLAMA),
    "qwen": _family("qwen", *TOKENS, *LLAMA),
    "qwen2": _family("qwen2", *TOKENS, *LLAMA),
    "qwen3": _family("qwen3", *TOKENS, *LLAMA),
    "phi3": _family("phi3", *TOKENS, *attention(r"transformer_layer_\d+/attention"), *FEEDFORWARD),
    "smollm3": _family(
        "smollm3",
        *TOKENS,
        # keras-hub names every layer's output projection plain "o_proj" (no layer prefix).
        _rule(r"transformer_layer_\d+/self_attn/(q_proj|k_proj|v_proj)/kernel", HEADS_IN, _QKV_NOTE),
        _rule(r"(transformer_layer_\d+/self_attn/)?o_proj/kernel", HEADS_OUT, _OUT_NOTE),
        *mlp(r"transformer_layer_\d+/mlp/(gate_proj|up_proj)", r"transformer_layer_\d+/mlp/down_proj"),
        replicated(r"rotary_emb/inv_freq", "rotary frequencies: a buffer, replicated"),
    ),
    "mixtral": _family(
        "mixtral",
        *TOKENS,
        *LLAMA_ATTENTION,
        *experts(
            r"mixtral_sparse_moe_block(_\d+)?/experts",
            "expert_feedforward_(gate|intermediate)_dense",
            "expert_feedforward_output_dense",
            r"mixtral_sparse_moe_block(_\d+)?/sparse_feedforward_gate_dense",
        ),
    ),
    "qwen_moe": _family("qwen_moe", *TOKENS, *LLAMA, *QWEN_MOE),
    "qwen3_moe": _family(
        "qwen3_moe",
        *TOKENS,
        *LLAMA,
        *experts(
            r"qwen3_sparse_moe_block(_\d+)?/experts",
            "expert_feedforward_gate_dense",
            "expert_feedforward_output_dense",
            r"qwen3_sparse_moe_block(_\d+)?/sparse_feedforward_gate_dense",
        ),
    ),
    "qwen3_5": _family("qwen3_5", *QWEN3_5),
    "qwen3_5_moe": _family(
        "qwen3_5_moe",
        *QWEN3_5,
        *experts(
            r"sparse_moe_block(_\d+)?/experts",
            "expert_feedforward_gate_dense",
            "expert_feedforward_output_dense",
            r"sparse_moe_block(_\d+)?/router_gate",
        ),
        replicated(r"sparse_moe_block(_\d+)?/shared_expert_gate/kernel", "shared expert gate: one output, replicated"),
    ),
    "gpt_oss": _family(
        "gpt_oss",
        *TOKENS,
        *LLAMA_ATTENTION,
        replicated(r"self_attention/sinks", "attention sinks: one scalar per head, replicated"),
        *experts(
            r"sparse_moe_block(_\d+)?/experts",
            "gate_up_proj",
            "down_proj",
            r"sparse_moe_block(_\d+)?/router/router_dense",
        ),
    ),
    "gemma": _family("gemma", *TOKENS, *GEMMA),
    "gemma2": _family("gemma2", *TOKENS, *GEMMA),
    "gemma3": _family("gemma3", *TOKENS, *GEMMA),
    "gpt2": _family("gpt2", *TOKENS, *LLAMA, TABLES),
    "opt": _family("opt", *TOKENS, *LLAMA, TABLES),
    "gpt_neox": _family(
        "gpt_neox",
        *TOKENS,
        *attention(r"transformer_layer_\d+/self_attention", names=("query_key_value",)),
        *FEEDFORWARD,
    ),
    "falcon": _family(
        "falcon",
        *TOKENS,
        *attention(
            r"transformer_layer_\d+/attention", names=("query_dense", "key_dense", "value_dense"), output="output_dense"
        ),
        *mlp(r"transformer_layer_\d+/dense_h_to_4h", r"transformer_layer_\d+/dense_4h_to_h"),
    ),
    "bloom": _family(
        "bloom",
        *TOKENS,
        *attention(
            r"transformer_layer_\d+/self_attention",
            names=("query_dense", "key_dense", "value_dense"),
            output="output_dense",
        ),
        *mlp(r"transformer_layer_\d+/mlp_intermediate_dense", r"transformer_layer_\d+/mlp_output_dense"),
    ),
    "bert": _family("bert", *TOKENS, *BERT),
    "roberta": _family("roberta", *TOKENS, *BERT),
    "xlm_roberta": _family("xlm_roberta", *TOKENS, *BERT),
    "distil_bert": _family("distil_bert", *TOKENS, *BERT),
    "electra": _family("electra", *TOKENS, *BERT, EMBEDDING_PROJECTION),
    "albert": _family("albert", *TOKENS, *BERT, EMBEDDING_PROJECTION),
    "deberta_v3": _family(
        "deberta_v3",
        *TOKENS,
        *BERT,
        _rule(r"rel_embedding/rel_embedding", FEATURES, "relative position table: hidden on 'model'"),
    ),
    "f_net": _family(
        "f_net",
        *TOKENS,
        TABLES,
        EMBEDDING_PROJECTION,
        _rule("pooled_dense/kernel", COLUMN, "pooler: column-parallel"),
        *mlp(r"f_net_layer_\d+/intermediate_dense", r"f_net_layer_\d+/output_dense"),
    ),
    "bart": _family("bart", *TOKENS, *BERT, *DECODER_ATTENTION),
    "whisper": _family(
        "whisper",
        *TOKENS,
        *BERT,
        *DECODER_ATTENTION,
        _rule(
            r"encoder_token_embedding_conv_layer_\d+/kernel", FEATURES, "audio convolution: output features on 'model'"
        ),
    ),
    "t5": _family(
        "t5",
        *TOKENS,
        *attention(
            r"(self_attention|cross_attention)",
            ("query_projector", "key_projector", "value_projector"),
            "output_projector",
        ),
        _rule(
            r"self_attention/embeddings",
            [(None, "model")],
            "relative attention bias (buckets, heads): heads on 'model'",
        ),
        *mlp(
            r"transformer_(encoder|decoder)_layer_\d+/(input|gate)_projector",
            r"transformer_(encoder|decoder)_layer_\d+/output_projector",
        ),
    ),
    "roformer_v2": _family(
        "roformer_v2",
        *TOKENS,
        TABLES,
        *attention("attention_layer", ("q_dense_layer", "k_dense_layer", "v_dense_layer"), "o_dense_layer"),
        *FEEDFORWARD,
    ),
    "esm": _family(
        "esm",
        *TOKENS,
        TABLES,
        *attention("attention_layer", ("q_dense_layer", "k_dense_layer", "v_dense_layer"), "o_dense_layer"),
        *FEEDFORWARD,
    ),
    "vit": _family(
        "vit",
        PATCHES,
        VISION_TOKENS,
        TABLES,
        *VIT_BLOCK,
        *mlp(r"transformer_block_\d+/mlp/dense_1", r"transformer_block_\d+/mlp/dense_2"),
    ),
    "deit": _family(
        "deit",
        PATCHES,
        VISION_TOKENS,
        *VIT_BLOCK,
        *mlp(r"transformer_block_\d+/mlp/dense", r"transformer_block_\d+/output_layer/output"),
    ),
    "dinov2": _family(
        "dinov2",
        PATCHES,
        VISION_TOKENS,
        *attention(r"layers_\d+/attention/attention"),
        *mlp(r"layers_\d+/mlp/(fc1|weights_in)", r"layers_\d+/mlp/(fc2|weights_out)"),
        replicated(r"layer_scale\d/lambda1", "layer scale: a per-feature vector, replicated"),
    ),
    "clip": _family("clip", *TOKENS, PATCHES, VISION_TOKENS, TABLES, POSITION_IDS, *CLIP_BLOCK, *CONTRASTIVE_HEAD),
    "siglip": _family(
        "siglip", *TOKENS, PATCHES, VISION_TOKENS, TABLES, POSITION_IDS, *SIGLIP_BLOCK, *CONTRASTIVE_HEAD
    ),
}

# The keras-hub backbone class each family's rules are written for.
BACKBONES = {
    "llama": "LlamaBackbone",
    "llama3": "Llama3Backbone",
    "mistral": "MistralBackbone",
    "qwen": "QwenBackbone",
    "qwen2": "Qwen2Backbone",
    "qwen3": "Qwen3Backbone",
    "phi3": "Phi3Backbone",
    "smollm3": "SmolLM3Backbone",
    "mixtral": "MixtralBackbone",
    "qwen_moe": "QwenMoeBackbone",
    "qwen3_moe": "Qwen3MoeBackbone",
    "qwen3_5": "Qwen3_5Backbone",
    "qwen3_5_moe": "Qwen3_5MoeBackbone",
    "gpt_oss": "GptOssBackbone",
    "gemma": "GemmaBackbone",
    "gemma2": "GemmaBackbone",
    "gemma3": "Gemma3Backbone",
    "gpt2": "GPT2Backbone",
    "opt": "OPTBackbone",
    "gpt_neox": "GPTNeoXBackbone",
    "falcon": "FalconBackbone",
    "bloom": "BloomBackbone",
    "bert": "BertBackbone",
    "roberta": "RobertaBackbone",
    "xlm_roberta": "XLMRobertaBackbone",
    "distil_bert": "DistilBertBackbone",
    "electra": "ElectraBackbone",
    "albert": "AlbertBackbone",
    "deberta_v3": "DebertaV3Backbone",
    "f_net": "FNetBackbone",
    "bart": "BartBackbone",
    "whisper": "WhisperBackbone",
    "t5": "T5Backbone",
    "roformer_v2": "RoformerV2Backbone",
    "esm": "ESMBackbone",
    "vit": "ViTBackbone",
    "deit": "DeiTBackbone",
    "dinov2": "DINOV2Backbone",
    "clip": "CLIPBackbone",
    "siglip": "SigLIPBackbone",
}
