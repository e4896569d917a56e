from tests.subprocess_utils import run_python


def test_kdist_selects_jax_before_keras_is_imported():
    result = run_python("import kdist, keras; print(keras.backend.backend())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "jax"


def test_keras_already_imported_with_another_backend():
    result = run_python("import keras; import kdist", env={"KERAS_BACKEND": "numpy"})
    assert result.returncode != 0
    assert "Keras was already imported with the 'numpy' backend" in result.stderr
    assert "Import kdist before keras" in result.stderr


def test_keras_backend_variable_names_another_backend():
    result = run_python("import kdist", env={"KERAS_BACKEND": "torch"})
    assert result.returncode != 0
    assert "KERAS_BACKEND='torch', but kdist needs 'jax'" in result.stderr
