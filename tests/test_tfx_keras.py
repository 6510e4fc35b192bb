"""A TFX module gets Keras 2 as `tf.keras`, as TFX gives it, also in a process that read `tf.keras`
as Keras 3 first (a script or notebook calling run_local): a run_fn's Keras 3 model saved with
`tf.saved_model.save` does not restore in a TF1 Session, the way TF Serving calls a model."""
import sys

import keras
import pytest
import tensorflow as tf

from components.tfx_module_file import module_function, tfx_keras
from trainer.session_check import session_problem

MODULE = '''
import tensorflow as tf
from tensorflow import keras
from tensorflow.keras import layers
from tensorflow.keras.layers import Dense


def run_fn(fn_args):
    """Builds, fits and saves a small model, as a TFX module's run_fn does."""
    inputs = keras.Input(shape=(2,), name="x")
    model = keras.Model(inputs, Dense(3)(layers.Dense(4, activation="relu")(inputs)))
    model.compile(optimizer="adam", loss="mse")
    model.fit(tf.zeros([8, 2]), tf.zeros([8, 3]), verbose=0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve(examples):
        x = tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([2], tf.float32)})["x"]
        return {"outputs": model(x)}

    tf.saved_model.save(model, fn_args, signatures={"serving_default": serve})
    return [keras.Model.__module__, layers.Dense.__module__, Dense.__module__]
'''


@pytest.fixture
def keras_3_first(monkeypatch):
    """tf.keras resolved to Keras 3 before any TFX module runs."""
    monkeypatch.setattr(tf, "keras", keras._tf_keras.keras)
    return keras._tf_keras.keras


def test_a_module_gets_keras_2_and_its_saved_model_runs_in_a_session(keras_3_first, tmp_path):
    module_file = tmp_path / "tfx_module.py"
    module_file.write_text(MODULE)
    keras_3_modules = {name: sys.modules.get(name) for name in ("tensorflow.keras", "tensorflow.keras.layers")}
    run_fn = module_function(str(module_file), "run_fn")  # imported in the block
    with tfx_keras():
        assert all(name.startswith("tf_keras.") for name in run_fn(str(tmp_path / "model")))
    assert tf.keras is keras_3_first  # put back, with the import system's view of it
    assert {name: sys.modules.get(name) for name in keras_3_modules} == keras_3_modules
    assert session_problem(str(tmp_path / "model")) is None


def test_keras_is_put_back_when_the_module_fails(keras_3_first):
    with pytest.raises(RuntimeError, match="run_fn failed"), tfx_keras():
        assert tf.keras is not keras_3_first
        raise RuntimeError("run_fn failed")
    assert tf.keras is keras_3_first


def test_without_it_the_same_module_s_keras_3_model_fails_in_a_session(keras_3_first, tmp_path):
    """What the block prevents: the same module imported and called with Keras 3 as `tf.keras`."""
    from tfx.utils import import_utils

    module_file = tmp_path / "keras_3_module.py"
    module_file.write_text(MODULE)
    run_fn = import_utils.import_func_from_source(str(module_file), "run_fn")  # as module_function, without the block
    assert run_fn(str(tmp_path / "model"))[0].startswith("keras.")
    assert "Could not find variable" in (session_problem(str(tmp_path / "model")) or "")
