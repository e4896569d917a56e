"""The planner's per-device peak on every mesh of 8 devices, against XLA:GPU compiled for 8 deviceless H100s.

Small keras-hub backbones (a decoder LM, GPT-2, BERT with its integer-indexed
pooler, ViT) at sizes that compile in seconds on a CPU, each planned for
target "H100" with materialized attention (deviceless XLA cannot take cuDNN's
flash attention) and every mesh compiled by XLA:GPU for 8 H100s without a GPU
(`verify_target="H100"`: needs jax-cuda13-pjrt). Small steps carry cuBLAS's
fixed workspaces, which the estimate leaves to the margin: batches are chosen
so the step is at least a few hundred MB per device.

Run: JAX_PLATFORMS=cpu python benchmarks/planner_vs_deviceless_sharded.py
Writes benchmarks/results/planner_vs_deviceless_sharded.json.

    ... planner_vs_deviceless_sharded.py --devices 64 --models llama,gpt2 --batch 128

plans and compiles the same backbones for 64 H100s with a batch of 128
(2 examples per device on data=64), into
planner_vs_deviceless_sharded_64.json. With --models, the file's rows of
the other models are kept, each with the date of the run that took it; with
--meshes "fsdp=8;data=2,fsdp=4" only those meshes are compiled again and their
rows replaced. With
--reestimate, the stored rows keep XLA's figures (they depend on the model,
the mesh and jax, not on kdist's estimate) and get this checkout's estimate,
without compiling (given the flags the rows were compiled with: it stops,
the file untouched, when a stored config is not among those it plans).

    ... planner_vs_deviceless_sharded.py --held-out
    ... planner_vs_deviceless_sharded.py --held-out --devices 16

plan and compile configs that no band cites (`HELD_OUT`: Qwen2 at sequence
256, OPT, a mixed-precision Llama on 8 devices; Mistral on 16) into
planner_vs_deviceless_held_out.json and planner_vs_deviceless_held_out_16.json.

    ... planner_vs_deviceless_sharded.py --moe

plans and compiles kdist's tiny mixture-of-experts configs (`MOE`) into
planner_vs_deviceless_moe.json.

    ... planner_vs_deviceless_sharded.py --full-size

plans and compiles two whole configs issue 21 reported (`FULL_SIZE`: GPT-2
small, ViT-Base) into planner_vs_deviceless_full_size.json.

    ... planner_vs_deviceless_sharded.py --families

plans and compiles eight more keras-hub families at hidden 256 (`FAMILIES`)
into planner_vs_deviceless_families.json (with --models gemma2 --devices 4 or
16, Gemma 2's soft-capped attention on 4 or 16 devices, into ..._4.json and
..._16.json, and with --models gemma2 --width 512,4 at hidden 512 and 4 layers, into ..._h512_l4.json, and
with --models gemma2 --dtype bfloat16 in bfloat16 throughout, into ..._bfloat16.json; with
--devices 6 --batch 48 --width 384,2 --models falcon,gpt_neox,phi3, three at hidden 384 on 6
devices, into ..._6_h384_l2.json); with --families-held-out twelve
more, built alike after the estimate's rules were drawn (`FAMILIES_HELD_OUT`),
into planner_vs_deviceless_families_held_out.json (with --devices 16 --models
gemma3,t5,llama3,xlm_roberta, four of them on 16 devices, into ..._16.json;
with --devices 4, all twelve on 4 devices, into ..._4.json;
with --models llama3,xlm_roberta,t5,gemma3 --batch 8 --sequence 1024, four at
1024 tokens, into ..._s1024.json, and with --models llama3,xlm_roberta,t5,bart --batch 256 --sequence 64, four at 64
tokens, into ..._s64.json; with --models llama3,electra,deberta_v3,xlm_roberta
--dtype bfloat16, four in bfloat16 throughout, into ..._bfloat16.json, and with --models t5,qwen3 --dtype float16 two in
float16 into ..._float16.json; with --width 512,4
--models llama3,qwen3,xlm_roberta,t5,gemma3,smollm3,electra,bart,deberta_v3,esm, ten at hidden 512 and 4 layers,
into ..._h512_l4.json, and with --devices 16 --models gemma3,t5 two of them on 16 devices, into
..._16_h512_l4.json; with --models gemma3 --width 768,4 --meshes "model=8;data=2,model=4;fsdp=2,model=4;data=8",
Gemma 3 at hidden 768 on four meshes, into ..._h768_l4.json; with --devices 32 --batch 128 --models
llama3,xlm_roberta, two on 32 devices,
into ..._32.json; with --devices 6 --batch 48 --models llama3,qwen3,xlm_roberta,gemma3, four on 6 devices,
into ..._6.json, and with --width 384,2 --models llama3,xlm_roberta,gemma3 at hidden 384 into
..._6_h384_l2.json; with --devices 2 --batch 16 --models llama3,qwen3,xlm_roberta,gemma3,t5, five on 2 devices,
into ..._2.json; with --devices 12 --batch 48 --width 384,2 --models llama3,xlm_roberta,gemma3,t5, four at hidden
384 on 12 devices, into ..._12_h384_l2.json, and with --devices 24 the same four on 24 devices, into
..._24_h384_l2.json; with --devices 10 --batch 40, the twelve on 10 devices, into ..._10.json, and with --width 320,2
--models llama3,xlm_roberta,gemma3,t5 into ..._10_h320_l2.json; with --devices 7 --batch 28 --width 448,2 and
--devices 3 --batch 24 --width 384,2, the twelve on 7 and on 3 devices, into ..._7_h448_l2.json and
..._3_h384_l2.json; with --remat --batch 128 --models llama3,qwen3,gemma3,electra,xlm_roberta,t5, six of them planned
and compiled with every node of the graph recomputed, into ..._remat.json, with --devices 1 --batch 16 on one device,
into ..._1_remat.json, and with --devices 4 --batch 64 --models smollm3,bart,esm,deberta_v3 four others on 4 devices,
into ..._4_remat.json, and with --remat --dtype bfloat16 --batch 128 --models llama3,qwen3,gemma3 into
..._bfloat16_remat.json); with --families-unseen two families no earlier run compiled
(`FAMILIES_UNSEEN`: RoFormerV2, Whisper), into planner_vs_deviceless_families_unseen.json; with --outside-zoo six
keras-hub backbones kdist.zoo does not have (`FAMILIES_OUTSIDE_ZOO`: XLNet, ESM-2, EdRec, RWKV-7, DINOv3, Swin), into
planner_vs_deviceless_outside_zoo.json; with --newest-families two more no run had compiled (`NEWEST_FAMILIES`:
Gemma 4, T5Gemma), into planner_vs_deviceless_newest_families.json (with --dtype bfloat16 and --devices 16 into
..._bfloat16.json and ..._16.json, with --models gemma4 --width 512,4 and the four meshes above into
..._h512_l4.json); with --other-backbones nine more (`OTHER_BACKBONES`: T5Gemma 2, Gemma 3n,
PaliGemma, ViTDet, MiT, VGG, ResNet with basic blocks, Xception, HGNetV2), into
planner_vs_deviceless_other_backbones.json (with --devices 16 --models resnet,xception, two of them on 16 devices,
into ..._16.json); with --untried-backbones four more compiled after every rule
(`UNTRIED_BACKBONES`: Qwen-MoE, CLIP's and SigLIP's vision encoders, CSPNet), into
planner_vs_deviceless_untried_backbones.json; with --more-backbones ten more (`MORE_BACKBONES`: Qwen, Moonshine,
VideoPrism, SegFormer, DeepLabV3, MobileNetV3, DepthAnything, RetinaNet, BASNet, PARSeq), into
planner_vs_deviceless_more_backbones.json; with --tasks six keras-hub
tasks, head and loss whole (`TASKS`: the causal LMs of Llama 3, Qwen3, Gemma 3 and GPT-2 with a vocabulary of
16384, BART's seq2seq LM, a BERT text classifier), into planner_vs_deviceless_tasks.json; with --mixed-lengths four
whose inputs differ in length, given by name (`MIXED_LENGTHS`: T5 and BART at 512 source and 128 target tokens,
Whisper at 1000 audio frames and 128 tokens, SAM with a point and a box), into
planner_vs_deviceless_mixed_lengths.json; with --sam3 SAM 3 at the size of keras-hub's own test (`SAM3`), into
planner_vs_deviceless_sam3.json;
with --long-spans Qwen3.5,
whose gated delta net runs about 500 kernels in one sublayer's backward,
into planner_vs_deviceless_long_spans.json; with --mixed-precision eight of
them in mixed_bfloat16 (`MIXED_PRECISION`), into
planner_vs_deviceless_mixed_precision.json (with --devices 16 --models falcon,qwen3, two of them on 16
devices, into ..._16.json); with --mixed-float16 the same
eight in mixed_float16 (`MIXED_FLOAT16`), into
planner_vs_deviceless_mixed_float16.json.

    ... planner_vs_deviceless_sharded.py --cnns

plans and compiles three Keras Applications CNNs (`CNNS`: MobileNetV2,
EfficientNetB0, DenseNet121) into planner_vs_deviceless_cnns.json.

    ... planner_vs_deviceless_sharded.py --cnns-held-out

plans and compiles three more (`CNNS_HELD_OUT`: ResNet50, InceptionV3,
ConvNeXtTiny), first run with the convolution rules drawn from `CNNS`, into
planner_vs_deviceless_cnns_held_out.json. With `--devices 1 --batch 32` either
CNN list is compiled for one H100 (files ending in _1), with `--devices 16`
for 16 (_16: MobileNetV2 and ResNet50 so far, `--models`); with `--cnns-held-out --devices 4` the three
on 4 (_4), with `--dtype bfloat16` on 8 in bfloat16 (_bfloat16: a Keras Application is built under that policy).

    ... planner_vs_deviceless_sharded.py --cnns-max-pools

plans and compiles three more with max pools at smaller sizes (`CNNS_MAX_POOLS`:
VGG16, VGG19, Xception) into planner_vs_deviceless_cnns_max_pools.json.
"""

import argparse
import importlib
import json
import os
import re
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # before jax starts: the CUDA plugin registers without a GPU

from planner_vs_gpu import band_fields  # noqa: E402

from kdist.abstract import dtype_policy_scope  # noqa: E402  (after JAX_PLATFORMS: importing kdist imports jax)
from kdist.rules.hub import BACKBONES  # noqa: E402
from kdist.zoo import PUBLISHED, TINY  # noqa: E402

DEVICES = 8
# How every deviceless benchmark plans and compiles: H100s, attention materialized (deviceless XLA cannot take
# cuDNN's flash attention), and the compile for the same H100s (verify_target).
PLAN_OPTIONS = dict(target="H100", attention="materialized")
VERIFY_TARGET = "H100"
# The widths of the small decoder LMs (grouped-query attention, rotary positions) and of the small models with a
# learned position table (GPT-2, BERT); the held-out configs below take them for other families.
DECODER = dict(
    vocabulary_size=8192, num_layers=4, num_query_heads=8, num_key_value_heads=2, hidden_dim=512, intermediate_dim=1536
)
LEARNED_POSITIONS = dict(
    vocabulary_size=8192, num_layers=4, num_heads=8, hidden_dim=512, intermediate_dim=2048, max_sequence_length=512
)
CONFIGS = [
    (
        "llama h512 4 layers v8192 b32 s512",
        "LlamaBackbone",
        DECODER,
        32,
        512,
    ),
    (
        "gpt2 h512 4 layers v8192 b32 s512",
        "GPT2Backbone",
        LEARNED_POSITIONS,
        32,
        512,
    ),
    (
        "bert h512 4 layers v8192 b32 s512",
        "BertBackbone",
        LEARNED_POSITIONS,
        32,
        512,
    ),
    (
        # Gemma-2B's widths (multi-query attention, a 256k-token embedding: 70% of the weights) with 2 of its 18 layers
        "gemma h2048 2 layers v256000 b32 s512",
        "GemmaBackbone",
        dict(
            vocabulary_size=256000,
            num_layers=2,
            num_query_heads=8,
            num_key_value_heads=1,
            hidden_dim=2048,
            intermediate_dim=32768,
            head_dim=256,
        ),
        32,
        512,
    ),
    (
        # Biases, layer norms and ALiBi (no position table), GPT-2's widths: on model=8 XLA delays the weight-gradient
        # kernels as on batch-split meshes (docs/plan.md, "Weight-gradient kernels wait for their reduction")
        "bloom h512 4 layers v8192 b32 s512",
        "BloomBackbone",
        dict(vocabulary_size=8192, num_layers=4, num_heads=8, hidden_dim=512, intermediate_dim=2048),
        32,
        512,
    ),
    (
        "vit h384 4 layers p16 224 b64",
        "ViTBackbone",
        dict(image_shape=(224, 224, 3), patch_size=16, num_layers=4, num_heads=6, hidden_dim=384, mlp_dim=1536),
        64,
        None,
    ),
]


def hub_builder(cls, config):
    """A function building keras-hub's backbone `cls` (or a dotted path: "keras.applications.MobileNetV2") with
    `config` (keras-hub imported when it runs, after kdist); a (class, config) pair in `config` (a task's
    "backbone", a segmenter's "image_encoder") is built first. A Keras Application takes no dtype: a "dtype" in
    its `config` is the dtype policy it is built under."""
    module, _, name = cls.rpartition(".")

    def build():
        kwargs = {k: hub_builder(*v)() if _built(v) else v for k, v in config.items()}
        policy = kwargs.pop("dtype", None) if module == "keras.applications" else None
        with dtype_policy_scope(policy):
            return getattr(importlib.import_module(module or "keras_hub.models"), name)(**kwargs)

    return build


def _built(value):
    """Whether a config value is a (class, config) pair to build (not a shape)."""
    return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], dict)


# Mixture-of-experts backbones: kdist's tiny zoo configs (hidden 64, 2 layers, 4 experts, top 2) at a batch that makes
# the step tens of MB per device. `--moe` plans and compiles them into planner_vs_deviceless_moe.json: where the
# estimate does not model XLA's expert layers under fsdp (`calibration.MOE_FSDP_HIGH`).
MOE = [
    (f"{family} h64 2 layers 4 experts v256 b256 s64", BACKBONES[family], TINY[family], 256, 64)
    for family in ("mixtral", "qwen3_moe", "gpt_oss")
]


# Held out: configs no band cites (other families, a shorter sequence, mixed precision, 16 devices), to see how the
# bands and the estimate carry to configs they were not drawn from. `--held-out` plans and compiles these instead,
# into planner_vs_deviceless_held_out.json (with --devices 16: the last entry only, into ..._held_out_16.json).
HELD_OUT = [
    (
        "qwen2 h512 4 layers v8192 b32 s256",
        "Qwen2Backbone",
        dict(
            vocabulary_size=8192,
            num_layers=4,
            num_query_heads=8,
            num_key_value_heads=4,
            hidden_dim=512,
            intermediate_dim=1536,
        ),
        32,
        256,
    ),
    (
        "opt h512 4 layers v8192 b32 s512",
        "OPTBackbone",
        LEARNED_POSITIONS,
        32,
        512,
    ),
    (
        "llama mixed_bfloat16 h512 4 layers v8192 b32 s512",
        "LlamaBackbone",
        {**DECODER, "dtype": "mixed_bfloat16"},
        32,
        512,
    ),
    (
        "mistral h512 4 layers v8192 b64 s256",
        "MistralBackbone",
        DECODER,
        64,
        256,
    ),
]

# Full size: two of the configs issue 21 reported (GPT-2 small at batch 16 x 512, ViT-Base), whole, re-measured with
# today's rules and placement (its Gemma-2B, 18 layers, takes more than 5 minutes per mesh to compile on 2 CPUs: CONFIGS
# has its widths with 2 layers). `--full-size` plans and compiles these into planner_vs_deviceless_full_size.json; the
# fsdp and model-axis bands are drawn from them instead of the rows.
FULL_SIZE = [
    ("gpt2 base h768 12 layers v50257 b16 s512", *PUBLISHED["gpt2-base"][:2], 16, 512),
    ("vit base h768 12 layers p16 224 b64", *PUBLISHED["vit-base"][:2], 64, None),
]

# Families the tables above do not have: kdist's tiny keras-hub configs (kdist.zoo.TINY) widened to hidden 256 (MLP
# 1024, vocabulary 4096, 2 layers), at batch 32 x 256 tokens or 256 images of 32 x 32. `--families` plans and compiles
# these into planner_vs_deviceless_families.json; the bands are drawn from them too.
WIDER = dict(
    vocabulary_size=4096, hidden_dim=256, intermediate_dim=1024, mlp_dim=1024, num_layers=2, max_sequence_length=256
)


def _widened(names, overrides=None, dtype=None):
    """kdist's tiny configs of keras-hub families `names` widened to WIDER (and `overrides`: name -> settings; `dtype`:
    a dtype policy, named in the label), at batch 32 x 256 tokens or 256 images, as config entries."""
    entries = []
    for name in names:
        config = {k: WIDER.get(k, v) for k, v in TINY[name].items()} | (overrides or {}).get(name, {})
        config |= {"dtype": dtype} if dtype else {}
        batch, sequence = (256, None) if "image_shape" in config else (32, 256)
        label = f"{name}{f' {dtype}' if dtype else ''} h256 2 layers b{batch}" + (f" s{sequence}" if sequence else "")
        entries.append((label, BACKBONES[name], config, batch, sequence))
    return entries


FAMILIES = _widened(("falcon", "gpt_neox", "phi3", "roberta", "distil_bert", "gemma2", "deit", "dinov2"))

# Held out: twelve more families, built the same way, compiled after every rule of the estimate was drawn (Gemma 3 with
# its presets' settings: no soft caps). No band cites them. `--families-held-out` plans and compiles these into
# planner_vs_deviceless_families_held_out.json.
NO_SOFT_CAPS = {"attention_logit_soft_cap": None, "final_logit_soft_cap": None}
FAMILIES_HELD_OUT = _widened(
    "gemma3 qwen3 llama3 smollm3 electra albert xlm_roberta deberta_v3 t5 bart esm f_net".split(),
    {"gemma3": NO_SOFT_CAPS},
)

# keras-hub tasks: a backbone, its head, and the loss Keras compiles the task with (sparse cross-entropy), which no
# other run compiles: its configs are backbones. Four causal LMs and BART's seq2seq LM with a vocabulary of 16384, so
# that the logits and their gradient are the step's largest values, and a BERT text classifier (3 classes).
# `--tasks` plans and compiles these into planner_vs_deviceless_tasks.json.
TASK_HEADS = {  # family: (its task in the label, the task class's suffix, the task's own settings)
    "llama3": ("causal lm", "CausalLM", {}),
    "qwen3": ("causal lm", "CausalLM", {}),
    "gemma3": ("causal lm", "CausalLM", {}),
    "gpt2": ("causal lm", "CausalLM", {}),
    "bart": ("seq2seq lm", "Seq2SeqLM", {}),
    "bert": ("text classifier", "TextClassifier", {"num_classes": 3}),
}
TASKS = [
    (
        label.replace(" h256", f" {TASK_HEADS[family][0]} h256").replace(" b32", " v16384 b32"),
        BACKBONES[family].replace("Backbone", TASK_HEADS[family][1]),
        dict(backbone=(BACKBONES[family], {**config, "vocabulary_size": 16384}), preprocessor=None)
        | TASK_HEADS[family][2],
        batch,
        sequence,
    )
    for family, (label, _, config, batch, sequence) in zip(
        TASK_HEADS, _widened(TASK_HEADS, {"gemma3": NO_SOFT_CAPS, "bert": {"max_sequence_length": 256}})
    )
]

# Unseen: two families of kdist.zoo.TINY no rule, band or earlier run has compiled, widened the same way (RoFormerV2's
# head size and Whisper's position tables grown with them). `--families-unseen` plans and compiles these into
# planner_vs_deviceless_families_unseen.json.
FAMILIES_UNSEEN = _widened(
    ["roformer_v2", "whisper"],
    {
        "roformer_v2": {"head_size": 32},
        "whisper": {"max_encoder_sequence_length": 512, "max_decoder_sequence_length": 256},
    },
)

# Inputs of different lengths (`sequence_length` by input name): T5's and BART's encoder at 512 tokens and decoder at
# 128, Whisper's 1000 audio frames (500 after its stride 2, its encoder's position table grown to them) and 128 tokens,
# widened as above; and SAM (a ViTDet image encoder, hidden 256, 4 layers, 256 x 256 images) with one point and one
# box per image and no mask (`masks` of length 0). The last word of a label gives the lengths. `--mixed-lengths` plans
# and compiles these into planner_vs_deviceless_mixed_lengths.json.
SEQ2SEQ_LENGTHS = {"encoder_token_ids": 512, "encoder_padding_mask": 512, "decoder_token_ids": 128}
SEQ2SEQ_LENGTHS["decoder_padding_mask"] = 128
WHISPER_LENGTHS = {"encoder_features": 1000, "decoder_token_ids": 128, "decoder_padding_mask": 128}
SAM_IMAGE = 256
MIXED_LENGTHS = [
    (label.replace(" s256", f" s{tag}"), cls, config, batch, lengths)
    for (label, cls, config, batch, _), (tag, lengths) in zip(
        _widened(
            ["t5", "bart", "whisper"],
            {
                "bart": {"max_sequence_length": 512},
                "whisper": {"max_encoder_sequence_length": 1000, "max_decoder_sequence_length": 256},
            },
        ),
        [("512:128", SEQ2SEQ_LENGTHS), ("512:128", SEQ2SEQ_LENGTHS), ("1000:128", WHISPER_LENGTHS)],
    )
] + [
    (
        f"sam vitdet h256 4 layers i{SAM_IMAGE} b32 p1:1:0",
        "SAMBackbone",
        dict(
            image_encoder=(
                "ViTDetBackbone",
                dict(
                    hidden_size=256,
                    num_layers=4,
                    intermediate_dim=1024,
                    num_heads=8,
                    global_attention_layer_indices=[1, 3],
                    patch_size=16,
                    num_output_channels=256,
                    window_size=4,
                    image_shape=(SAM_IMAGE, SAM_IMAGE, 3),
                ),
            ),
            prompt_encoder=(
                "keras_hub.layers.SAMPromptEncoder",
                dict(
                    hidden_size=256,
                    image_embedding_size=(SAM_IMAGE // 16, SAM_IMAGE // 16),
                    input_image_size=(SAM_IMAGE, SAM_IMAGE),
                    mask_in_channels=16,
                ),
            ),
            mask_decoder=(
                "keras_hub.layers.SAMMaskDecoder",
                dict(
                    num_layers=2,
                    hidden_size=256,
                    intermediate_dim=1024,
                    num_heads=8,
                    embedding_dim=256,
                    num_multimask_outputs=3,
                    iou_head_depth=3,
                    iou_head_hidden_dim=256,
                ),
            ),
        ),
        32,
        {"points": 1, "labels": 1, "boxes": 1, "masks": (0, SAM_IMAGE, SAM_IMAGE)},
    )
]

# Outside the zoo: six keras-hub backbones kdist.zoo does not have (so no rule set of their own: kdist's default rules
# place them), at the widths above (hidden 256, MLP 1024, 2 layers or stages; 64 x 64 images), batch 32 x 256 tokens or
# 32 images. `--outside-zoo` plans and compiles these into planner_vs_deviceless_outside_zoo.json.
FAMILIES_OUTSIDE_ZOO = [
    (
        "xlnet h256 2 layers b32 s256",
        "XLNetBackbone",
        dict(vocabulary_size=4096, num_layers=2, num_heads=8, hidden_dim=256, intermediate_dim=1024),
        32,
        256,
    ),
    (
        "esm2 h256 2 layers b32 s256",
        "ESM2Backbone",
        dict(
            vocabulary_size=64,
            num_layers=2,
            num_heads=8,
            hidden_dim=256,
            intermediate_dim=1024,
            max_sequence_length=256,
        ),
        32,
        256,
    ),
    (
        "edrec h256 2+2 layers b32 s256",
        "EdRecBackbone",
        dict(vocab_size=4096, num_layers_enc=2, num_layers_dec=2, hidden_dim=256, intermediate_dim=1024, num_heads=8),
        32,
        256,
    ),
    (
        "rwkv7 h256 2 layers b32 s256",
        "RWKV7Backbone",
        dict(
            hidden_size=256,
            head_size=32,
            num_layers=2,
            vocabulary_size=4096,
            intermediate_dim=1024,
            gate_lora=32,
            mv_lora=16,
            aaa_lora=16,
            decay_lora=16,
        ),
        32,
        256,
    ),
    (
        "dinov3 h256 2 layers p8 64 b32",
        "DINOV3Backbone",
        dict(patch_size=8, num_layers=2, hidden_dim=256, num_heads=8, intermediate_dim=1024, image_shape=(64, 64, 3)),
        32,
        None,
    ),
    (
        "swin e64 2+2 blocks w4 64 b32",
        "SwinTransformerBackbone",
        dict(image_shape=(64, 64, 3), embed_dim=64, depths=(2, 2), num_heads=(2, 4), window_size=4),
        32,
        None,
    ),
]

# T5Gemma's and T5Gemma 2's config at the widths above: two stacks of 2 layers, sliding-window then global attention.
GEMMA_ENCODER_DECODER = dict(
    vocabulary_size=4096,
    sliding_window=128,
    **{
        f"{part}_{key}": value
        for part in ("encoder", "decoder")
        for key, value in dict(
            hidden_dim=256,
            intermediate_dim=1024,
            num_layers=2,
            layer_types=["sliding_attention", "full_attention"],
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
        ).items()
    },
)

# Newest: two keras-hub backbones no earlier run compiled and kdist.zoo does not have, added 2026-11-28 after every
# rule of the estimate (Gemma 4 text-only, with sliding-window layers; T5Gemma, an encoder-decoder of Gemma layers with
# grouped-query attention), at the widths above. `--newest-families` plans and compiles these into
# planner_vs_deviceless_newest_families.json.
NEWEST_FAMILIES = [
    (
        "gemma4 h256 2 layers b32 s256",
        "Gemma4Backbone",
        dict(
            vocabulary_size=4096,
            image_size=None,
            num_layers=2,
            num_query_heads=8,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=1024,
            head_dim=32,
            sliding_window_size=128,
            sliding_window_pattern=2,
        ),
        32,
        256,
    ),
    (
        "t5gemma h256 2+2 layers b32 s256",
        "T5GemmaBackbone",
        GEMMA_ENCODER_DECODER,
        32,
        256,
    ),
]

# keras-hub's MiT (SegFormer's encoder) and ResNet with basic blocks at 128 x 128 (OTHER_BACKBONES; the encoders of
# SegFormer and DeepLabV3 in MORE_BACKBONES).
MIT_128 = dict(
    layerwise_depths=[1, 1],
    num_layers=2,
    layerwise_num_heads=[1, 2],
    layerwise_sr_ratios=[4, 2],
    max_drop_path_rate=0.0,
    layerwise_patch_sizes=[7, 3],
    layerwise_strides=[4, 2],
    image_shape=(128, 128, 3),
    hidden_dims=[64, 128],
)
RESNET_BASIC_128 = dict(
    input_conv_filters=[64],
    input_conv_kernel_sizes=[7],
    stackwise_num_filters=[64, 128],
    stackwise_num_blocks=[1, 1],
    stackwise_num_strides=[1, 2],
    block_type="basic_block",
    image_shape=(128, 128, 3),
)
RESNET_BASIC_128_3 = {  # three stages: RetinaNet's pyramid reads P3 and P4
    **RESNET_BASIC_128,
    "stackwise_num_filters": [64, 128, 256],
    "stackwise_num_blocks": [1, 1, 1],
    "stackwise_num_strides": [1, 2, 2],
}

# Other backbones: nine keras-hub backbones no earlier run compiled, added 2026-11-28 after every rule of the estimate
# (three language models: T5Gemma 2, Gemma 3n text-only, PaliGemma with its image encoder; two vision transformers,
# ViTDet with windowed attention and MiT's efficient attention; four CNNs, VGG, ResNet with basic blocks, Xception and
# HGNetV2), at about the widths above (hidden 256; 128 x 128 images, ViTDet's 256 x 256). `--other-backbones` plans
# and compiles these into planner_vs_deviceless_other_backbones.json. Two more were tried and are not here: verify
# cannot build Keras's compiled step for Moonshine (its attention-mask output) and VideoPrism (`docs/plan.md`, "Nine
# more backbones").
OTHER_BACKBONES = [
    (
        "paligemma h256 2 layers i64 b32 s256",
        "PaliGemmaBackbone",
        dict(
            vocabulary_size=4096,
            image_size=64,
            num_layers=2,
            num_query_heads=8,
            num_key_value_heads=1,
            hidden_dim=256,
            intermediate_dim=1024,
            head_dim=32,
            vit_patch_size=8,
            vit_num_heads=8,
            vit_hidden_dim=256,
            vit_num_layers=2,
        ),
        32,
        256,
    ),
    (
        "t5gemma2 h256 2+2 layers b32 s256",
        "T5Gemma2Backbone",
        GEMMA_ENCODER_DECODER,
        32,
        256,
    ),
    (
        "gemma3n h256 2 layers b32 s256",
        "Gemma3nBackbone",
        dict(
            text_vocab_size=4096,
            text_hidden_size=256,
            num_hidden_layers=2,
            pad_token_id=0,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=[1024, 1024],
            hidden_activation="gelu_approximate",
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=128,
            rope_theta=10000.0,
            max_position_embeddings=512,
            vocab_size_per_layer_input=4096,
            hidden_size_per_layer_input=64,
            altup_num_inputs=2,
            laurel_rank=16,
        ),
        32,
        256,
    ),
    (
        "vitdet h256 2 layers p16 256 b32",
        "ViTDetBackbone",
        dict(
            hidden_size=256,
            num_layers=2,
            intermediate_dim=1024,
            num_heads=8,
            global_attention_layer_indices=[1],
            image_shape=(256, 256, 3),
            patch_size=16,
            window_size=8,
        ),
        32,
        None,
    ),
    (
        "mit e64,128 1+1 blocks 128 b64",
        "MiTBackbone",
        MIT_128,
        64,
        None,
    ),
    (
        "vgg 32,64,128 128 b64",
        "VGGBackbone",
        dict(stackwise_num_repeats=[1, 1, 2], stackwise_num_filters=[32, 64, 128], image_shape=(128, 128, 3)),
        64,
        None,
    ),
    (
        "resnet basic 64,128 128 b64",
        "ResNetBackbone",
        RESNET_BASIC_128,
        64,
        None,
    ),
    (
        "xception 32-256 128 b64",
        "XceptionBackbone",
        dict(
            stackwise_conv_filters=[[32, 64], [64, 128], [256, 256]],
            stackwise_pooling=[True, True, False],
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
    (
        "hgnetv2 64,128 128 b64",
        "HGNetV2Backbone",
        dict(
            depths=[1, 1],
            embedding_size=32,
            hidden_sizes=[64, 128],
            stem_channels=[3, 16, 32],
            hidden_act="relu",
            use_learnable_affine_block=False,
            stackwise_stage_filters=[[32, 32, 64, 1, 3, 3], [64, 64, 128, 1, 3, 3]],
            apply_downsample=[False, True],
            use_lightweight_conv_block=[False, False],
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
]

# Untried backbones: four keras-hub backbones no earlier run compiled, added 2026-11-29 after every rule of the estimate
# (Qwen-MoE, whose experts' sums a shared expert joins; the vision encoders of CLIP and SigLIP at 128 x 128; CSPNet's
# cross-stage CNN). `--untried-backbones` plans and compiles these into planner_vs_deviceless_untried_backbones.json.
UNTRIED_BACKBONES = [
    (
        "qwen_moe h256 2 layers 4 experts b32 s256",
        "QwenMoeBackbone",
        dict(
            vocabulary_size=4096,
            num_layers=2,
            num_query_heads=8,
            num_key_value_heads=2,
            hidden_dim=256,
            intermediate_dim=1024,
            moe_intermediate_dim=256,
            shared_expert_intermediate_dim=512,
            num_experts=4,
            top_k=2,
        ),
        32,
        256,
    ),
    (
        "clip_vision h256 2 layers p16 128 b64",
        "CLIPVisionEncoder",
        dict(
            patch_size=16, hidden_dim=256, num_layers=2, num_heads=8, intermediate_dim=1024, image_shape=(128, 128, 3)
        ),
        64,
        None,
    ),
    (
        "siglip_vision h256 2 layers p16 128 b64",
        "SigLIPVisionEncoder",
        dict(
            patch_size=16, hidden_dim=256, num_layers=2, num_heads=8, intermediate_dim=1024, image_shape=(128, 128, 3)
        ),
        64,
        None,
    ),
    (
        "cspnet 64,128 128 b64",
        "CSPNetBackbone",
        dict(
            stem_filters=32,
            stem_kernel_size=3,
            stem_strides=2,
            stackwise_depth=[1, 2],
            stackwise_strides=[1, 2],
            stackwise_num_filters=[64, 128],
            block_type="bottleneck_block",
            stage_type="csp",
            bottle_ratio=[0.5],
            expand_ratio=[2.0],
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
]

# More backbones: ten keras-hub backbones no earlier run compiled, added 2026-11-29 (Qwen, Moonshine's audio
# encoder-decoder, VideoPrism's factorized video encoder, SegFormer on a MiT encoder, DeepLabV3 on a ResNet; then
# keras-hub's MobileNetV3, DepthAnything on DINOv2, RetinaNet's FPN and BASNet on ResNets, PARSeq on a ViT).
# `--more-backbones` plans and compiles these into planner_vs_deviceless_more_backbones.json.
MORE_BACKBONES = [
    (
        "qwen h256 2 layers b32 s256",
        "QwenBackbone",
        dict(
            vocabulary_size=4096,
            num_layers=2,
            num_query_heads=8,
            num_key_value_heads=8,
            hidden_dim=256,
            intermediate_dim=1024,
        ),
        32,
        256,
    ),
    (
        "moonshine h256 2+2 layers b32 s2048",
        "MoonshineBackbone",
        dict(
            vocabulary_size=4096,
            filter_dim=256,
            encoder_num_layers=2,
            decoder_num_layers=2,
            hidden_dim=256,
            intermediate_dim=1024,
            encoder_num_heads=8,
            decoder_num_heads=8,
        ),
        32,
        2048,
    ),
    (
        "videoprism h256 2+1 layers 4 frames p16 128 b32",
        "VideoPrismBackbone",
        dict(
            num_frames=4,
            patch_size=16,
            hidden_dim=256,
            intermediate_dim=1024,
            num_heads=8,
            num_spatial_layers=2,
            num_temporal_layers=1,
            num_auxiliary_layers=0,
            image_shape=(128, 128, 3),
        ),
        32,
        None,
    ),
    (
        "segformer mit 64,128 128 b64",
        "SegFormerBackbone",
        dict(
            image_encoder=("MiTBackbone", MIT_128),
            projection_filters=128,
        ),
        64,
        None,
    ),
    (
        "deeplabv3 resnet basic 64,128 128 b64",
        "DeepLabV3Backbone",
        dict(
            image_encoder=("ResNetBackbone", RESNET_BASIC_128),
            spatial_pyramid_pooling_key="P3",
            upsampling_size=2,
            dilation_rates=[6, 12],
            low_level_feature_key="P2",
            projection_filters=48,
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
    (
        "mobilenet v3 16-48 128 b64",
        "MobileNetBackbone",
        dict(
            stackwise_expansion=[[40, 56], [64, 144, 144], [72, 72], [144, 288, 288]],
            stackwise_num_blocks=[2, 3, 2, 3],
            stackwise_num_filters=[[16, 16], [24, 24, 24], [24, 24], [48, 48, 48]],
            stackwise_kernel_size=[[3, 3], [5, 5, 5], [5, 5], [5, 5, 5]],
            stackwise_num_strides=[[2, 1], [2, 1, 1], [1, 1], [2, 1, 1]],
            stackwise_se_ratio=[[None, None], [0.25, 0.25, 0.25], [0.3, 0.3], [0.3, 0.25, 0.25]],
            stackwise_activation=[["relu", "relu"], ["hard_swish"] * 3, ["hard_swish"] * 2, ["hard_swish"] * 3],
            stackwise_padding=[[1, 1], [2, 2, 2], [2, 2], [2, 2, 2]],
            output_num_filters=288,
            depthwise_filters=8,
            depthwise_stride=2,
            depthwise_residual=False,
            last_layer_filter=288,
            squeeze_and_excite=0.5,
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
    (
        "depth_anything dinov2 h128 4 layers p14 224 b16",
        "DepthAnythingBackbone",
        dict(
            image_encoder=(
                "DINOV2Backbone",
                dict(
                    patch_size=14,
                    num_layers=4,
                    hidden_dim=128,
                    num_heads=4,
                    intermediate_dim=512,
                    image_shape=(224, 224, 3),
                    position_embedding_shape=(518, 518),
                ),
            ),
            reassemble_factors=[4, 2, 1, 0.5],
            neck_hidden_dims=[16, 32, 64, 128],
            fusion_hidden_dim=128,
            head_hidden_dim=16,
            head_in_index=-1,
            feature_keys=["stage1", "stage2", "stage3", "stage4"],
        ),
        16,
        None,
    ),
    (
        "retinanet resnet basic 64-256 128 b64",
        "RetinaNetBackbone",
        dict(
            image_encoder=("ResNetBackbone", RESNET_BASIC_128_3),
            min_level=3,
            max_level=4,
            use_p5=False,
            image_shape=(128, 128, 3),
        ),
        64,
        None,
    ),
    (
        "basnet resnet basic 64-512 128 b32",
        "BASNetBackbone",
        dict(
            image_encoder=(
                "ResNetBackbone",
                {
                    **RESNET_BASIC_128,
                    "stackwise_num_filters": [64, 128, 256, 512],
                    "stackwise_num_blocks": [1, 1, 1, 1],
                    "stackwise_num_strides": [1, 2, 2, 2],
                    "image_shape": (None, None, 3),
                },
            ),
            num_classes=1,
            image_shape=(128, 128, 3),
        ),
        32,
        None,
    ),
    (
        "parseq vit h128 2+1 layers 32x128 b64 s26",
        "PARSeqBackbone",
        dict(
            image_encoder=(
                "ViTBackbone",
                dict(
                    image_shape=(32, 128, 3),
                    patch_size=(4, 8),
                    num_layers=2,
                    num_heads=4,
                    hidden_dim=128,
                    mlp_dim=512,
                    use_class_token=False,
                ),
            ),
            vocabulary_size=97,
            max_label_length=25,
            decoder_hidden_dim=128,
            num_decoder_layers=1,
            num_decoder_heads=4,
            decoder_mlp_dim=512,
        ),
        64,
        26,
    ),
]

# A sublayer whose backward runs far more kernels than any above: Qwen3.5's gated delta net (a 63-step correction loop
# per chunk, about 500 kernels in its backward against at most 33 in the configs the bands are drawn from).
# `--long-spans` plans and compiles it into planner_vs_deviceless_long_spans.json (`calibration.LONG_SPAN_LOW`).
LONG_SPANS = _widened(["qwen3_5"])

# Mixed precision: eight of the families above in mixed_bfloat16 (float32 weights, bfloat16 compute).
# `--mixed-precision` plans and compiles these into planner_vs_deviceless_mixed_precision.json
# (`calibration.MIXED_PRECISION_HIGH`).
MIXED_PRECISION_FAMILIES = "falcon gpt_neox phi3 roberta qwen3 gemma3 t5 bart".split()
MIXED_PRECISION = _widened(MIXED_PRECISION_FAMILIES, {"gemma3": NO_SOFT_CAPS}, dtype="mixed_bfloat16")
# The same eight in mixed_float16 (float16 compute; Keras's compile() wraps the optimizer in a LossScaleOptimizer).
# `--mixed-float16` plans and compiles these into planner_vs_deviceless_mixed_float16.json.
MIXED_FLOAT16 = _widened(MIXED_PRECISION_FAMILIES, {"gemma3": NO_SOFT_CAPS}, dtype="mixed_float16")


# SAM 3 at the size of keras-hub's own backbone test (hidden 32 throughout, 112 x 112 images, 16 queries, 32 tokens and
# 32 boxes per image), batch 8: `--sam3` plans and compiles it into planner_vs_deviceless_sam3.json. Its box encoder's
# ROI align runs in a `cond` fixed by the boxes' static count and gathers each channel by an iota (docs/plan.md,
# "SAM 3, compiled on every mesh of 8").
_SAM3_SIZES = dict(hidden_dim=32, intermediate_dim=128, num_heads=2)
SAM3 = [
    (
        "sam3 h32 i112 q16 b8 s32",
        "SAM3PromptableConceptBackbone",
        dict(
            vision_encoder=(
                "keras_hub.layers.SAM3VisionEncoder",
                dict(
                    image_shape=(112, 112, 3),
                    patch_size=14,
                    num_layers=2,
                    fpn_hidden_dim=32,
                    fpn_scale_factors=[4.0, 2.0, 1.0, 0.5],
                    pretrain_image_shape=(112, 112, 3),
                    window_size=2,
                    global_attn_indexes=[1, 2],
                    **_SAM3_SIZES,
                ),
            ),
            text_encoder=(
                "keras_hub.layers.SAM3TextEncoder",
                dict(vocabulary_size=1024, embedding_dim=32, num_layers=2, **_SAM3_SIZES),
            ),
            geometry_encoder=("keras_hub.layers.SAM3GeometryEncoder", dict(num_layers=3, roi_size=7, **_SAM3_SIZES)),
            detr_encoder=("keras_hub.layers.SAM3DetrEncoder", dict(num_layers=3, **_SAM3_SIZES)),
            detr_decoder=(
                "keras_hub.layers.SAM3DetrDecoder",
                dict(image_shape=(112, 112, 3), patch_size=14, num_layers=2, num_queries=16, **_SAM3_SIZES),
            ),
            mask_decoder=(
                "keras_hub.layers.SAM3MaskDecoder",
                dict(num_upsampling_stages=3, hidden_dim=32, num_heads=2),
            ),
        ),
        8,
        32,
    )
]


def _applications(*names):
    """Keras Applications `names` untrained, at 224 x 224 and batch 256, as config entries."""
    return [(f"{n.lower()} 224 b256", f"keras.applications.{n}", dict(weights=None), 256, None) for n in names]


# Convolutional networks: three Keras Applications no band row was drawn from, at 224 x 224 and 32 images per device.
# `--cnns` plans and compiles these into planner_vs_deviceless_cnns.json; the CNN band is drawn from them.
CNNS = _applications("MobileNetV2", "EfficientNetB0", "DenseNet121")
# Compiled first with the convolution rules of `kdist.planning.propagation` drawn from CNNS: held out from them.
CNNS_HELD_OUT = _applications("ResNet50", "InceptionV3", "ConvNeXtTiny")
# Three more Keras Applications with max pools, smaller images at batch 64, compiled after the rule that makes a
# pool's indices late where no collective runs before its backward (2026-11-29) and held out from it. `--cnns-max-pools`
# plans and compiles them into planner_vs_deviceless_cnns_max_pools.json.
CNNS_MAX_POOLS = [
    ("vgg16 64 b64", "keras.applications.VGG16", dict(weights=None, input_shape=(64, 64, 3), classes=10), 64, None),
    (
        "vgg19 96 b64",
        "keras.applications.VGG19",
        dict(weights=None, input_shape=(96, 96, 3), include_top=False, pooling="avg"),
        64,
        None,
    ),
    (
        "xception 128 b64",
        "keras.applications.Xception",
        dict(weights=None, input_shape=(128, 128, 3), classes=10),
        64,
        None,
    ),
]


def _per_layer(value, layers, wanted):
    """`value` of a config with `layers` layers for one with `wanted`: a list with one entry per layer (SmolLM3's
    layer types) repeated to the new depth, anything else unchanged."""
    if isinstance(value, list) and len(value) == layers:
        return [value[i % layers] for i in range(wanted)]
    return value


def compiled_rows(result, **fields):
    """A row per compiled candidate of `result`: `fields`, the mesh, the estimate, XLA's figure, their ratio."""
    return [
        {
            **fields,
            "mesh": c.spec,
            "estimate": c.peak,
            "xla_gpu_deviceless": c.compiled["peak"],
            "ratio": round(c.ratio, 3),
        }
        for c in result.candidates
        if c.compiled
    ]


def resized(entry, batch=None, sequence=None, dtype=None):
    """Config entry `entry` at another global batch, tokens per example (a position table grows to them) or Keras
    dtype policy, each named in its label as the stored rows name it; None keeps the entry's."""
    label, cls, config, entry_batch, entry_sequence = entry
    if dtype:
        label, config = label.replace(" ", f" {dtype} ", 1), {**config, "dtype": dtype}
    batch = batch or entry_batch
    label = label.replace(label.split()[-2] if entry_sequence else label.split()[-1], f"b{batch}")
    if sequence and isinstance(entry_sequence, int):
        label, entry_sequence = label.replace(label.split()[-1], f"s{sequence}"), sequence
        if config.get("max_sequence_length", sequence) < sequence:
            config = {**config, "max_sequence_length": sequence}
    return label, cls, config, batch, entry_sequence


def at_width(entry, hidden, layers):
    """A widened family's config entry (h256, 2 layers) at hidden size `hidden` (MLP 4x) and `layers` layers,
    named so in its label."""
    label, cls, config, batch, sequence = entry
    sizes = dict(hidden_dim=hidden, intermediate_dim=4 * hidden, mlp_dim=4 * hidden, num_layers=layers)
    return (
        label.replace("h256 2 layers", f"h{hidden} {layers} layers"),
        cls,
        {k: sizes.get(k, _per_layer(v, config["num_layers"], layers)) for k, v in config.items()},
        batch,
        sequence,
    )


def config_named(model):
    """The first entry of the config lists above (CONFIGS ... CNNS_HELD_OUT) whose label begins with `model`'s words."""
    words = model.split()
    every = CONFIGS + HELD_OUT + MOE + FULL_SIZE + FAMILIES + FAMILIES_HELD_OUT + LONG_SPANS + MIXED_PRECISION
    every += MIXED_FLOAT16 + CNNS + CNNS_HELD_OUT + CNNS_MAX_POOLS + FAMILIES_UNSEEN + FAMILIES_OUTSIDE_ZOO
    every += NEWEST_FAMILIES
    every += OTHER_BACKBONES + UNTRIED_BACKBONES + MORE_BACKBONES + TASKS + MIXED_LENGTHS + SAM3
    return next(c for c in every if c[0].split()[: len(words)] == words)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=DEVICES)
    parser.add_argument("--models", default="", help="comma-separated label prefixes (default: all)")
    parser.add_argument("--batch", type=int, default=None, help="global batch (default: each config's)")
    parser.add_argument(
        "--sequence", type=int, default=None, help="tokens per example (default: each config's), into a file ..._s<N>"
    )
    parser.add_argument(
        "--dtype", default=None, help="a Keras dtype policy for every config (named in its label), into a file ..._<it>"
    )
    parser.add_argument(
        "--width",
        default=None,
        help="HIDDEN,LAYERS: the widened families (h256, 2 layers) at this hidden size (MLP 4x) and depth, into a file "
        "..._h<HIDDEN>_l<LAYERS>",
    )
    parser.add_argument(
        "--meshes", default="", help="';'-separated meshes to compile again, their rows replaced (default: every mesh)"
    )
    parser.add_argument(
        "--remat", action="store_true", help="plan and compile with remat=True (labels say so), into a file ..._remat"
    )
    parser.add_argument("--held-out", action="store_true", help="the HELD_OUT configs, into their own file")
    parser.add_argument(
        "--reestimate", action="store_true", help="recompute the stored rows' estimates, keeping XLA's figures"
    )
    parser.add_argument("--moe", action="store_true", help="the tiny mixture-of-experts configs (MOE) instead")
    parser.add_argument("--full-size", action="store_true", help="issue 21's whole configs (FULL_SIZE) instead")
    parser.add_argument("--families", action="store_true", help="other keras-hub families (FAMILIES) instead")
    parser.add_argument(
        "--families-held-out", action="store_true", help="twelve more families (FAMILIES_HELD_OUT) instead"
    )
    parser.add_argument(
        "--families-unseen", action="store_true", help="two families no earlier run compiled (FAMILIES_UNSEEN) instead"
    )
    parser.add_argument(
        "--outside-zoo", action="store_true", help="six keras-hub backbones outside kdist.zoo (FAMILIES_OUTSIDE_ZOO)"
    )
    parser.add_argument(
        "--newest-families", action="store_true", help="two keras-hub backbones added 2026-11-28 (NEWEST_FAMILIES)"
    )
    parser.add_argument(
        "--other-backbones", action="store_true", help="nine keras-hub backbones added 2026-11-28 (OTHER_BACKBONES)"
    )
    parser.add_argument(
        "--untried-backbones", action="store_true", help="four keras-hub backbones added 2026-11-29 (UNTRIED_BACKBONES)"
    )
    parser.add_argument(
        "--more-backbones", action="store_true", help="ten keras-hub backbones added 2026-11-29 (MORE_BACKBONES)"
    )
    parser.add_argument("--tasks", action="store_true", help="keras-hub tasks, head and loss whole (TASKS)")
    parser.add_argument("--sam3", action="store_true", help="SAM 3 at keras-hub's test size (SAM3) instead")
    parser.add_argument(
        "--mixed-lengths", action="store_true", help="inputs of different lengths, by name (MIXED_LENGTHS) instead"
    )
    parser.add_argument("--cnns", action="store_true", help="Keras Applications CNNs (CNNS) instead")
    parser.add_argument("--long-spans", action="store_true", help="Qwen3.5's long backward sublayer (LONG_SPANS)")
    parser.add_argument("--cnns-held-out", action="store_true", help="the CNNS_HELD_OUT CNNs instead")
    parser.add_argument("--cnns-max-pools", action="store_true", help="three more CNNs with max pools (CNNS_MAX_POOLS)")
    parser.add_argument(
        "--mixed-precision", action="store_true", help="eight families in mixed_bfloat16 (MIXED_PRECISION) instead"
    )
    parser.add_argument(
        "--mixed-float16", action="store_true", help="the same eight in mixed_float16 (MIXED_FLOAT16) instead"
    )
    args = parser.parse_args()
    devices = args.devices
    if args.moe:
        configs, name = MOE, "moe"
    elif args.full_size:
        configs, name = FULL_SIZE, "full_size"
    elif args.families:
        configs, name = FAMILIES, "families"
    elif args.families_held_out:
        configs, name = FAMILIES_HELD_OUT, "families_held_out"
    elif args.families_unseen:
        configs, name = FAMILIES_UNSEEN, "families_unseen"
    elif args.outside_zoo:
        configs, name = FAMILIES_OUTSIDE_ZOO, "outside_zoo"
    elif args.newest_families:
        configs, name = NEWEST_FAMILIES, "newest_families"
    elif args.other_backbones:
        configs, name = OTHER_BACKBONES, "other_backbones"
    elif args.untried_backbones:
        configs, name = UNTRIED_BACKBONES, "untried_backbones"
    elif args.more_backbones:
        configs, name = MORE_BACKBONES, "more_backbones"
    elif args.tasks:
        configs, name = TASKS, "tasks"
    elif args.sam3:
        configs, name = SAM3, "sam3"
    elif args.mixed_lengths:
        configs, name = MIXED_LENGTHS, "mixed_lengths"
    elif args.cnns:
        configs, name = CNNS, "cnns"
    elif args.long_spans:
        configs, name = LONG_SPANS, "long_spans"
    elif args.cnns_held_out:
        configs, name = CNNS_HELD_OUT, "cnns_held_out"
    elif args.cnns_max_pools:
        configs, name = CNNS_MAX_POOLS, "cnns_max_pools"
    elif args.mixed_precision:
        configs, name = MIXED_PRECISION, "mixed_precision"
    elif args.mixed_float16:
        configs, name = MIXED_FLOAT16, "mixed_float16"
    elif args.held_out:
        configs, name = (HELD_OUT[:-1] if devices == DEVICES else HELD_OUT[-1:]), "held_out"
    else:
        configs, name = CONFIGS, "sharded"
    configs = [c for c in configs if not args.models or c[0].split()[0] in args.models.split(",")]
    if args.width:
        if not re.fullmatch(r"\d+,\d+", args.width):
            parser.error(f"--width takes HIDDEN,LAYERS, two whole numbers such as 512,4; got {args.width!r}")
        narrow = next((c[0] for c in configs if "h256 2 layers" not in c[0]), None)
        if narrow is not None:
            parser.error(
                f"--width resizes the widened families (h256, 2 layers: --families, --families-held-out, --long-spans, "
                f"--mixed-precision, --mixed-float16); the configs chosen include {narrow!r}"
            )
        hidden, layers = (int(n) for n in args.width.split(","))
        configs = [at_width(c, hidden, layers) for c in configs]
    suffix = ("" if devices == DEVICES else f"_{devices}") + (f"_s{args.sequence}" if args.sequence else "")
    suffix += f"_h{hidden}_l{layers}" if args.width else ""
    suffix += f"_{args.dtype}" if args.dtype else ""
    suffix += "_remat" if args.remat else ""
    out = Path(__file__).parent / "results" / f"planner_vs_deviceless_{name}{suffix}.json"
    earlier = json.loads(out.read_text()) if out.exists() else None

    import kdist
    from kdist.machine import machine_info

    kdist.fake_devices(devices)
    rows = []
    for entry in configs:
        label, cls, config, batch, sequence = resized(entry, args.batch, args.sequence, args.dtype)
        label += " remat" if args.remat else ""
        stored = {r["mesh"]: r for r in earlier["rows"] if r["config"] == label} if args.reestimate else None
        if stored == {}:
            continue
        start = time.perf_counter()
        result = kdist.plan(
            hub_builder(cls, config),
            devices,
            batch_size=batch,
            sequence_length=sequence,
            **PLAN_OPTIONS,
            remat=args.remat,
            verify=False if args.reestimate else (args.meshes.split(";") if args.meshes else True),
            verify_target=None if args.reestimate else VERIFY_TARGET,
        )
        for c in result.candidates:
            if args.reestimate:
                if c.spec not in stored:
                    continue
                reference = stored[c.spec]["xla_gpu_deviceless"]
            elif c.compiled:
                reference = c.compiled["peak"]
            else:
                continue
            rows.append(
                {
                    **(stored[c.spec] if args.reestimate else {}),
                    "config": label,
                    "mesh": c.spec,
                    "estimate": c.peak,
                    "xla_gpu_deviceless": reference,
                    "ratio": round(c.peak / reference, 3),
                    **band_fields(c, reference),
                    "terms": c.to_dict()["bytes"],
                    "step_estimate": c.to_dict()["step_estimate"],
                }
            )
            print(
                f"{label:38} {c.spec:22} {c.peak / 1e9:7.3f} GB {reference / 1e9:7.3f} GB {c.peak / reference:6.3f}",
                flush=True,
            )
        print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
    missed = {row["config"] for row in earlier["rows"]} - {row["config"] for row in rows} if args.reestimate else set()
    if missed and not args.models:  # writing would drop their rows: XLA's figures, a compile each to take again
        parser.error(
            f"--reestimate: the configs {sorted(missed)} stored in {out.name} are not among this run's; give the "
            "--batch, --sequence, --width, --dtype and --remat they were compiled with (the file is left as it was)"
        )
    result = {"machine": machine_info(), "target": f"{devices} H100s (deviceless XLA:GPU)", "rows": rows}
    if args.reestimate:
        result["compiled_on"] = earlier.get("compiled_on", earlier["machine"])  # where XLA's figures were taken
    if (args.models or args.meshes) and earlier:
        key = (lambda row: (row["config"], row["mesh"])) if args.meshes else (lambda row: row["config"])
        run = {key(row) for row in rows}
        kept = [row for row in earlier["rows"] if key(row) not in run]
        for row in kept:  # the date of the run that took it; `machine` is this run's
            row.setdefault("taken", earlier["machine"]["date"])
        before = {key(row): row for row in earlier["rows"]}
        for row in rows:  # a row compiled again keeps what its first run recorded of the estimate before it
            if "estimated_before_the_run" in before.get(key(row), {}):
                row["estimated_before_the_run"] = before[key(row)]["estimated_before_the_run"]
        result["rows"] = kept + rows
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
