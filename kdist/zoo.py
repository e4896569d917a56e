"""Models the CLI can name: built-in zoo entries or "module:function".

Besides kdist's small Keras models, the zoo has keras-hub backbones: published
configurations (`llama3-8b`, `llama3-70b`, `llama3-405b`, `gemma-2b`,
`bert-base`, `mixtral-8x7b`, `qwen3-moe-30b`, ...) and one tiny configuration
per backbone family that kdist's rules cover (`tiny-llama3`, `tiny-gemma`, ...;
see `tiny_entries()`). keras-hub is an optional dependency, imported only when
such an entry is built. Build big ones abstractly (`load_model(name)` does by
default): no weights are allocated.
"""

import contextlib
import functools
import importlib
import os
import sys

from kdist.abstract import abstract_model
from kdist.checks import shown
from kdist.errors import ArgumentError, MissingDependencyError, ModelError, cause
from kdist.models import mnist_mlp, small_cnn, tiny_transformer
from kdist.rules.hub import BACKBONES

MODEL_HELP = (
    "a zoo name (`kdist zoo` lists them: mlp, tiny-transformer, llama3-8b, tiny-llama3, ...), "
    "module:function returning a Keras model (the current directory is importable), or a keras-hub "
    "preset: hub:NAME or the path of a preset directory (its config only: no weights are loaded)"
)

# name -> (build function, description)
ENTRIES = {
    "mlp": (mnist_mlp, "the Keras distribution guide's MNIST-sized MLP"),
    "cnn": (small_cnn, "a small CNN for 28x28x1 images"),
    "tiny-transformer": (tiny_transformer, "a tiny decoder LM of Keras core layers"),
}

HUB_INSTALL = (
    "keras-hub is not installed. kdist's keras-hub zoo entries and rule tests need it: "
    "`pip install --no-deps keras-hub` and `pip install 'kdist[hub]'` (its wheel's "
    "tensorflow-text requirement would replace tensorflow-cpu, hence --no-deps)."
)


def register(name, build, description):
    """Add a zoo entry: `build()` returns a Keras model."""
    ENTRIES[name] = (build, description)


def load_model(name, *, abstract=True):
    """Build the model `name` names: a zoo entry, "module:function", or a keras-hub preset.

    With `abstract=True` (the default) the model is built without allocating
    weights (see `kdist.abstract_model`).
    """
    build = model_builder(name)
    return abstract_model(build) if abstract else build()


# Whether keras-hub, imported here first, may import TensorFlow: it does so at import time (4 s) for its
# tokenizers and preprocessing layers; its models never use it. `hub_models_only()` turns it off.
_hub_imports_tensorflow = True


@contextlib.contextmanager
def hub_models_only():
    """Within: the zoo imports keras-hub without TensorFlow (4 s less), for code that uses its models only.

    Where nothing has imported keras-hub or TensorFlow yet, keras-hub's
    tokenizers and preprocessing layers then run without TensorFlow in this
    process, also after the block; its backbones and task models do not need
    it, and TensorFlow itself stays importable (tf.data). kdist's command line
    runs its commands within: they build models and never tokenize.
    """
    global _hub_imports_tensorflow
    before, _hub_imports_tensorflow = _hub_imports_tensorflow, False
    try:
        yield
    finally:
        _hub_imports_tensorflow = before


def keras_hub():
    """Import keras_hub, or raise a MissingDependencyError that says how to install it."""
    if not _hub_imports_tensorflow and not {"keras_hub", "tensorflow"} & sys.modules.keys():
        sys.modules["tensorflow"] = None  # `import tensorflow` raises ImportError: keras-hub reads it as absent
        try:
            return importlib.import_module("keras_hub")
        except ImportError:  # a keras-hub that cannot start without TensorFlow: import it whole below
            for name in [m for m in sys.modules if m.split(".")[0] == "keras_hub"]:
                del sys.modules[name]
        finally:
            del sys.modules["tensorflow"]
    try:
        return importlib.import_module("keras_hub")
    except ImportError as e:
        raise MissingDependencyError(f"{HUB_INSTALL} ({e})") from None


def hub_backbone(class_name, **config):
    """Build `keras_hub.models.<class_name>(**config)`; `vision_encoder`/`text_encoder` configs become encoders."""
    hub = keras_hub()
    for key in ("vision_encoder", "text_encoder"):
        if isinstance(config.get(key), tuple):
            encoder_class, encoder_config = config[key]
            config[key] = getattr(hub.models, encoder_class)(**encoder_config)
    return getattr(hub.models, class_name)(**config)


def tiny_entries():
    """Family name -> zero-argument function building that family's tiny keras-hub backbone.

    One per family of `kdist.rules.hub.FAMILIES`, in the same order. The
    configs have hidden sizes, heads and vocabularies divisible by 8; decoder
    LMs use grouped-query attention with 2 key/value heads (Gemma: 1, MQA), which
    do not divide a model axis of 4 or 8, so their key/value kernels exercise
    the rules' fallbacks.

    Example:

    ```python
    for family, build in kdist.zoo.tiny_entries().items():
        model = kdist.abstract_model(build)
    ```
    """
    return {family: functools.partial(hub_backbone, BACKBONES[family], **config) for family, config in TINY.items()}


# Shared tiny sizes.
_LM = dict(
    vocabulary_size=256, num_layers=2, hidden_dim=64, intermediate_dim=128, num_query_heads=8, num_key_value_heads=2
)
_ENCODER = dict(vocabulary_size=256, num_layers=2, hidden_dim=64, intermediate_dim=128, num_heads=8)
_IMAGE = dict(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=8, hidden_dim=64)
_CLIP_VISION = dict(
    patch_size=8, hidden_dim=64, num_layers=2, num_heads=8, intermediate_dim=128, image_shape=(32, 32, 3)
)
_CLIP_TEXT = dict(
    vocabulary_size=256,
    embedding_dim=64,
    hidden_dim=64,
    num_layers=2,
    num_heads=8,
    intermediate_dim=128,
    max_sequence_length=16,
)
# Qwen3.5: three linear-attention (gated DeltaNet) layers for each full-attention one.
_QWEN3_5 = dict(
    vocabulary_size=256,
    num_layers=4,
    num_query_heads=8,
    num_key_value_heads=2,
    head_dim=8,
    hidden_dim=64,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
)
_GEMMA2 = dict(
    query_head_dim_normalize=False,
    use_post_ffw_norm=True,
    use_post_attention_norm=True,
    attention_logit_soft_cap=50.0,
    final_logit_soft_cap=30.0,
    use_sliding_window_attention=True,
    sliding_window_size=16,
)

# family -> tiny config of its keras-hub backbone (`kdist.rules.hub.BACKBONES`)
TINY = {
    "llama": _LM,
    "llama3": _LM,
    "mistral": _LM,
    "qwen": dict(_LM, tie_word_embeddings=False),
    "qwen2": _LM,
    "qwen3": dict(_LM, head_dim=8, tie_word_embeddings=False),
    "phi3": _LM,
    "smollm3": dict(
        vocabulary_size=256,
        hidden_dim=64,
        intermediate_dim=128,
        num_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attention_bias=False,
        attention_dropout=0.0,
        rope_layer_enabled_list=[True, False],
        layer_types=["attention", "attention"],
        mlp_bias=False,
        layer_norm_epsilon=1e-6,
        max_position_embeddings=64,
        rope_theta=10000.0,
        partial_rotary_factor=1.0,
    ),
    "mixtral": dict(_LM, num_experts=4, top_k=2),
    "qwen_moe": dict(_LM, moe_intermediate_dim=32, shared_expert_intermediate_dim=64, num_experts=4, top_k=2),
    "qwen3_moe": dict(_LM, moe_intermediate_dim=32, num_experts=4, top_k=2, head_dim=8),
    "qwen3_5": dict(_QWEN3_5, intermediate_dim=128),
    "qwen3_5_moe": dict(_QWEN3_5, moe_intermediate_dim=32, shared_expert_intermediate_size=64, num_experts=4, top_k=2),
    "gpt_oss": dict(_LM, num_experts=4, top_k=2, head_dim=8),
    "gemma": dict(_LM, num_key_value_heads=1, head_dim=8),
    "gemma2": dict(_LM, head_dim=8, **_GEMMA2),
    "gemma3": dict(_LM, head_dim=8, image_size=32, **dict(_GEMMA2, query_head_dim_normalize=True)),
    "gpt2": dict(_ENCODER, max_sequence_length=32),
    "opt": dict(_ENCODER, max_sequence_length=32),
    "gpt_neox": dict(_ENCODER, max_sequence_length=32),
    "falcon": dict(vocabulary_size=256, num_layers=2, num_attention_heads=8, hidden_dim=64, intermediate_dim=128),
    "bloom": _ENCODER,
    "bert": dict(_ENCODER, max_sequence_length=32),
    "roberta": dict(_ENCODER, max_sequence_length=32),
    "xlm_roberta": dict(_ENCODER, max_sequence_length=32),
    "distil_bert": dict(_ENCODER, max_sequence_length=32),
    "electra": dict(
        vocab_size=256,
        num_layers=2,
        num_heads=8,
        hidden_dim=64,
        embedding_dim=32,
        intermediate_dim=128,
        max_sequence_length=32,
    ),
    "albert": dict(_ENCODER, embedding_dim=32, max_sequence_length=32),
    "deberta_v3": dict(_ENCODER, max_sequence_length=32, bucket_size=8),
    "f_net": dict(vocabulary_size=256, num_layers=2, hidden_dim=64, intermediate_dim=128, max_sequence_length=32),
    "bart": dict(_ENCODER, max_sequence_length=32),
    "whisper": dict(_ENCODER, max_encoder_sequence_length=32, max_decoder_sequence_length=16),
    "t5": dict(_ENCODER, tie_embedding_weights=False),
    "roformer_v2": dict(_ENCODER, head_size=8),
    "esm": dict(_ENCODER, max_sequence_length=32),
    "vit": dict(_IMAGE, mlp_dim=128),
    "deit": dict(_IMAGE, intermediate_dim=128),
    "dinov2": dict(
        patch_size=8,
        num_layers=2,
        hidden_dim=64,
        num_heads=8,
        intermediate_dim=128,
        image_shape=(32, 32, 3),
        position_embedding_shape=(32, 32, 3),
    ),
    "clip": dict(
        vision_encoder=("CLIPVisionEncoder", _CLIP_VISION),
        text_encoder=("CLIPTextEncoder", _CLIP_TEXT),
        projection_dim=64,
    ),
    "siglip": dict(
        vision_encoder=("SigLIPVisionEncoder", _CLIP_VISION), text_encoder=("SigLIPTextEncoder", _CLIP_TEXT)
    ),
}

# Published configurations (from the keras-hub presets / model cards).
_LLAMA3 = dict(vocabulary_size=128256, rope_max_wavelength=500000)
PUBLISHED = {
    "llama3-8b": (
        "Llama3Backbone",
        dict(
            _LLAMA3, num_layers=32, num_query_heads=32, num_key_value_heads=8, hidden_dim=4096, intermediate_dim=14336
        ),
        "Llama 3 8B",
    ),
    "llama3-70b": (
        "Llama3Backbone",
        dict(
            _LLAMA3, num_layers=80, num_query_heads=64, num_key_value_heads=8, hidden_dim=8192, intermediate_dim=28672
        ),
        "Llama 3 70B",
    ),
    "llama3-405b": (
        "Llama3Backbone",
        dict(
            _LLAMA3,
            num_layers=126,
            num_query_heads=128,
            num_key_value_heads=8,
            hidden_dim=16384,
            intermediate_dim=53248,
        ),
        "Llama 3.1 405B",
    ),
    "mistral-7b": (
        "MistralBackbone",
        dict(
            vocabulary_size=32000,
            num_layers=32,
            num_query_heads=32,
            num_key_value_heads=8,
            hidden_dim=4096,
            intermediate_dim=14336,
        ),
        "Mistral 7B",
    ),
    "mixtral-8x7b": (
        "MixtralBackbone",
        dict(
            vocabulary_size=32000,
            num_layers=32,
            num_query_heads=32,
            num_key_value_heads=8,
            hidden_dim=4096,
            intermediate_dim=14336,
            num_experts=8,
            top_k=2,
        ),
        "Mixtral 8x7B (mixture of 8 experts)",
    ),
    "qwen3-moe-30b": (
        "Qwen3MoeBackbone",
        dict(
            vocabulary_size=151936,
            num_layers=48,
            num_query_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            hidden_dim=2048,
            intermediate_dim=6144,
            moe_intermediate_dim=768,
            num_experts=128,
            top_k=8,
        ),
        "Qwen3 30B-A3B (mixture of 128 experts)",
    ),
    "gemma-2b": (
        "GemmaBackbone",
        dict(
            vocabulary_size=256000,
            num_layers=18,
            num_query_heads=8,
            num_key_value_heads=1,
            hidden_dim=2048,
            intermediate_dim=32768,
            head_dim=256,
        ),
        "Gemma 2B (multi-query attention)",
    ),
    "gemma-7b": (
        "GemmaBackbone",
        dict(
            vocabulary_size=256000,
            num_layers=28,
            num_query_heads=16,
            num_key_value_heads=16,
            hidden_dim=3072,
            intermediate_dim=49152,
            head_dim=256,
        ),
        "Gemma 7B",
    ),
    "bert-base": (
        "BertBackbone",
        dict(vocabulary_size=30522, num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072),
        "BERT base (uncased vocabulary)",
    ),
    "gpt2-base": (
        "GPT2Backbone",
        dict(
            vocabulary_size=50257,
            num_layers=12,
            num_heads=12,
            hidden_dim=768,
            intermediate_dim=3072,
            max_sequence_length=1024,
        ),
        "GPT-2 base",
    ),
    "vit-base": (
        "ViTBackbone",
        dict(image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072),
        "ViT-B/16",
    ),
}

for _name, (_class, _config, _what) in PUBLISHED.items():
    register(_name, functools.partial(hub_backbone, _class, **_config), f"keras-hub {_class}: {_what}")
for _family, _build in tiny_entries().items():
    register(f"tiny-{_family.replace('_', '-')}", _build, f"keras-hub {BACKBONES[_family]} at a tiny config")


def model_builder(name):
    """A zero-argument function building the model `name` names (see `MODEL_HELP`)."""
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"A model name must be a non-empty string; received {shown(name)}.")
    if name in ENTRIES:
        return ENTRIES[name][0]
    if name.startswith("hub:") or os.path.isfile(os.path.join(name, "config.json")):
        return functools.partial(hub_preset, name.removeprefix("hub:"))
    if ":" in name:
        return _function(name)
    raise ArgumentError(
        f"Unknown model {name!r}. Name a zoo entry ({', '.join(sorted(ENTRIES)[:8])}, ...: `kdist zoo` lists all), "
        "'module:function' returning a Keras model, or a keras-hub preset ('hub:NAME' or a preset directory)."
    )


def hub_preset(preset):
    """The backbone of a keras-hub preset (a name or a directory), built from its config: no weights are loaded."""
    hub = keras_hub()
    try:
        return hub.models.Backbone.from_preset(preset, load_weights=False)
    except Exception as e:  # keras-hub raises many kinds: unknown preset, no network, a bad config
        raise ModelError(f"Cannot build the keras-hub preset {preset!r}: {cause(e)}") from None


def _function(name):
    module_name, _, function_name = name.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` does: the project's own modules import
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ArgumentError(f"Cannot import module {module_name!r} of model {name!r}: {e}.") from None
    build = getattr(module, function_name, None)
    if not callable(build):
        raise ArgumentError(f"Module {module_name!r} has no function {function_name!r} (model {name!r}).")
    return build
