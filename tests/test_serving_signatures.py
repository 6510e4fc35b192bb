"""How the server calls a SavedModel's signatures: through a Session as TF Serving does, with the
eager call as the fallback, and the same answers either way."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from serving.servable import Servable

from serving.request_limits import RequestLimits
from tests.serving_helpers import example, export_model

RAW = {"bill_length_mm": np.array([[40.0], [51.5]], np.float32), "flipper_length_mm": np.array([[190.0], [222.0]], np.float32),
       "island": np.array([[b"Dream"], [b"Biscoe"]], dtype=object)}


def test_session_calls_match_the_eager_signatures(tmp_path):
    path = str(export_model(tmp_path / "1"))
    servable = Servable("penguins", 1, path, None, RequestLimits())
    assert servable.call_mode == "session"
    loaded = tf.saved_model.load(path)
    eager = {k: v.numpy() for k, v in loaded.signatures["predict_raw"](**{k: tf.constant(v) for k, v in RAW.items()}).items()}
    served = servable.run("predict_raw", RAW)
    assert served.keys() == eager.keys()
    for key in eager:
        if eager[key].dtype == object:
            np.testing.assert_array_equal(served[key], eager[key])
        else:
            np.testing.assert_allclose(served[key], eager[key], rtol=1e-6)
    serialized = np.array([example().SerializeToString()], dtype=object)
    by_example = servable.run("serving_default", {"inputs": serialized})
    np.testing.assert_allclose(by_example["scores"], served["scores"][:1], rtol=1e-6)
    # The Session callable takes the arrays as they are (no conversion in Python): fixed-width
    # numpy strings, str objects and strided slices give the same answers.
    variants = {"island": [RAW["island"].astype("U"), RAW["island"].astype("S"), np.array([["Dream"], ["Biscoe"]], object)],
                "bill_length_mm": [np.concatenate([RAW["bill_length_mm"], RAW["bill_length_mm"]], axis=1)[:, :1]]}
    for name, arrays in variants.items():
        for array in arrays:
            np.testing.assert_allclose(servable.run("predict_raw", {**RAW, name: array})["scores"], served["scores"], rtol=1e-6)
    servable.unload()


def test_the_metagraph_is_the_one_with_the_served_tags(tmp_path):
    """TF Serving loads the MetaGraph whose tags are --saved_model_tags (default `serve`): a model
    saved under other tags is refused with TensorFlow's NOT_FOUND, and served when asked for them."""
    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def double(self, x):
            return {"y": x * 2.0}

    module = Doubler()
    path = str(tmp_path / "1")
    tf.saved_model.save(module, path, signatures={"serving_default": module.double})
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(f"{path}/saved_model.pb", "rb") as f:
        proto.ParseFromString(f.read())
    proto.meta_graphs[0].meta_info_def.tags[:] = ["custom"]
    with open(f"{path}/saved_model.pb", "wb") as f:
        f.write(proto.SerializeToString())

    with pytest.raises(tf.errors.NotFoundError, match="MetaGraphDef associated with tags 'serve' could not be found"):
        Servable("doubler", 1, path, None, RequestLimits())
    servable = Servable("doubler", 1, path, None, RequestLimits(), tags=("custom",))
    assert servable.call_mode == "session"
    np.testing.assert_array_equal(servable.run("serving_default", {"x": np.array([[1.5]], np.float32)})["y"], [[3.0]])
    servable.unload()


def test_v1_control_flow_runs_on_the_default_executor(tmp_path):
    """The single-threaded executor refuses Switch/Merge: such a model is served by the default one."""
    from tensorflow.python.ops import control_flow_v2_toggles

    path = str(tmp_path / "1")
    graph = tf.Graph()
    with graph.as_default():
        control_flow_v2_toggles.disable_control_flow_v2()
        try:
            x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
            y = tf.compat.v1.cond(tf.reduce_sum(x) > 0, lambda: x * 2.0, lambda: x - 1.0)
        finally:
            control_flow_v2_toggles.enable_control_flow_v2()
        with tf.compat.v1.Session(graph=graph) as session:
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
                "serving_default": tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})})
            builder.save()

    servable = Servable("v1", 1, path, None, RequestLimits())
    assert servable.call_mode == "session (default executor)"
    np.testing.assert_array_equal(servable.run("serving_default", {"x": np.array([[1.5]], np.float32)})["y"], [[3.0]])
    np.testing.assert_array_equal(servable.run("serving_default", {"x": np.array([[-1.0]], np.float32)})["y"], [[-2.0]])


def test_without_the_private_session_api_the_signatures_are_called_eagerly(tmp_path, monkeypatch):
    """`Session._make_callable_from_options` is private TensorFlow API: where a release drops it,
    the server still loads the model and answers, through the eager call."""
    from tensorflow.python.client import session as session_lib

    monkeypatch.delattr(session_lib.BaseSession, "_make_callable_from_options")
    path = str(export_model(tmp_path / "1"))
    servable = Servable("penguins", 1, path, None, RequestLimits())
    assert servable.call_mode == "eager"
    loaded = tf.saved_model.load(path)
    eager = loaded.signatures["predict_raw"](**{k: tf.constant(v) for k, v in RAW.items()})
    np.testing.assert_allclose(servable.run("predict_raw", RAW)["scores"], eager["scores"].numpy(), rtol=1e-6)
    servable.unload()


def test_a_caller_for_some_outputs_answers_with_those_only(tmp_path, monkeypatch):
    """The Evaluator asks for the scores alone: the Session run fetches them (the class names
    beside them are not made), the eager fallback drops the others; the scores are the same."""
    from serving.signature_call import signature_caller

    path = str(export_model(tmp_path / "1"))
    with signature_caller(path, "predict_raw") as call:
        everything = call(RAW)
    assert {"scores", "classes"} <= everything.keys()
    with signature_caller(path, "predict_raw", outputs=["scores"]) as call:
        scores = call(RAW)
    assert scores.keys() == {"scores"}
    np.testing.assert_array_equal(scores["scores"], everything["scores"])
    with pytest.raises(KeyError, match=r"no output \['probabilities'\]"), signature_caller(path, "predict_raw", outputs=["probabilities"]):
        pass
    from tensorflow.python.client import session as session_lib

    monkeypatch.delattr(session_lib.BaseSession, "_make_callable_from_options")  # the eager fallback
    with signature_caller(path, "predict_raw", outputs=["scores"]) as call:
        eager = call(RAW)
    assert eager.keys() == {"scores"}
    np.testing.assert_allclose(eager["scores"], everything["scores"], rtol=1e-6)
