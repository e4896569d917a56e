# ruff: noqa: E401, E402, I001  -- README.md's first example, verbatim (tests/runtime/test_inputs_multiprocess.py checks it)
import kdist
kdist.fake_devices(8)                                       # no accelerator? 8 CPU devices (before jax starts)
kdist.initialize()                                          # started as N processes (kdist launch)? join them
import keras, numpy as np

keras.utils.set_random_seed(0)                              # the same data and weights in every process
keras.distribution.set_distribution(kdist.preset("2x4"))   # 2-way data x 4-way model parallel
model = kdist.models.mnist_mlp()                            # any Keras model, built as usual
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
x, y = np.random.rand(512, 28, 28, 1), np.random.randint(0, 10, 512)
model.fit(x, y, batch_size=64)
print(kdist.inspect(model))                                 # where every variable lives, bytes per device
