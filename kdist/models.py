"""Small Keras models used by the demo, the tests and the benchmarks."""

import keras
from keras import layers


def mnist_mlp():
    """The Keras distribution guide's MNIST-sized MLP."""
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(200, activation="relu", name="d1"),
            keras.layers.Dropout(0.4),
            keras.layers.Dense(10, activation="softmax", name="d2"),
        ],
        name="mlp",
    )


def small_cnn():
    """A small CNN for 28x28x1 images and 10 classes."""
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax", name="head"),
        ],
        name="cnn",
    )


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position to a (batch, sequence, features) input."""

    def build(self, input_shape):
        self.embeddings = self.add_weight(shape=tuple(input_shape[1:]), initializer="glorot_uniform", name="embeddings")

    def call(self, x):
        return x + self.embeddings


def tiny_transformer(vocabulary_size=512, sequence_length=32, hidden_dim=64, num_heads=4, num_layers=2):
    """A tiny decoder-only language model built from Keras core layers."""
    tokens = keras.Input(shape=(sequence_length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary_size, hidden_dim, name="token_embedding")(tokens)
    x = PositionEmbedding(name="position_embedding")(x)
    for i in range(num_layers):
        h = layers.LayerNormalization(name=f"block_{i}_attention_norm")(x)
        h = layers.MultiHeadAttention(num_heads, hidden_dim // num_heads, name=f"block_{i}_attention")(
            h, h, use_causal_mask=True
        )
        x = x + h
        h = layers.LayerNormalization(name=f"block_{i}_mlp_norm")(x)
        h = layers.Dense(4 * hidden_dim, activation="gelu", name=f"block_{i}_mlp_up")(h)
        x = x + layers.Dense(hidden_dim, name=f"block_{i}_mlp_down")(h)
    x = layers.LayerNormalization(name="final_norm")(x)
    logits = layers.Dense(vocabulary_size, name="lm_head")(x)
    return keras.Model(tokens, logits, name="tiny_transformer")
