"""examples/digits_gan (keras-io's GAN on digit images) through `loopline train` on a small slice
of the digits image folder: both models train, the run checkpoints and resumes, TensorBoard gets
the generated digits at each epoch, and the exported generator answers a latent vector with an
image through the serving signature, as the server calls it (warmup replay and Predict)."""
from __future__ import annotations

import glob
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import REPO, make_config
from tests.test_beam_args import run_example_gen

CONFIG = REPO / "examples" / "digits_gan" / "loopline.yaml"


def image_events(folder) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Tag -> (step, first image decoded) for what TensorBoard's images dashboard shows, read
    with TensorBoard's own event reader."""
    from tensorboard.backend.event_processing import plugin_event_accumulator

    accumulator = plugin_event_accumulator.EventAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    if "images" not in accumulator.ActivePlugins():
        return {}
    return {tag: [(e.step, tf.io.decode_png(tf.make_ndarray(e.tensor_proto)[2]).numpy()) for e in accumulator.Tensors(tag)]
            for tag in accumulator.PluginTagToContent("images")}


def optimizer_variables(checkpoint: str, name: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(checkpoint)
    prefix = f"optimizer_{name}/"
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map() if key.startswith(prefix)
            and ("_trainable_variables" in key or "_iterations" in key)}


@pytest.mark.slow
def test_digits_gan_trains_both_models_resumes_shows_digits_and_serves_the_generator(tmp_path, caplog):
    from examples.digits.make_data import write_digits
    from pipeline.config import load_config
    from pipeline.train_command import run_train
    from serving import service, warmup
    from serving.request_limits import RequestLimits
    from serving.servable import Servable
    from serving.signature_names import DEFAULT, PREDICT_METHOD
    from tensorflow_serving.apis import predict_pb2
    from trainer.export import export_model
    from trainer.export_config import ExportConfig
    from trainer.model import load_module

    images = tmp_path / "digits"
    assert write_digits(str(images), per_class=12) == 120
    overrides = [f"data.path={images}", f"pipeline.root={tmp_path / 'root'}", "trainer.batch_size=16",
                 "mlflow.enabled=false"]
    with caplog.at_level(logging.INFO, logger="loopline.trainer"):
        first = run_train(load_config(CONFIG, [*overrides, "trainer.epochs=1"]))
        epoch = first.steps
        second = run_train(load_config(CONFIG, [*overrides, "trainer.epochs=2"]))
    assert epoch >= 3 and second.steps == 2 * epoch
    assert f"resumed from step {epoch} " in caplog.text
    assert "train_discriminator_loss=" in caplog.text and "train_generator_loss=" in caplog.text
    assert "=nan" not in caplog.text

    # Both models trained in each epoch: every weight of each moved, each optimizer stepped once per step.
    work = first.work_dir
    checkpoints = {n: os.path.join(work, "checkpoints", f"ckpt-{n}") for n in (epoch, 2 * epoch)}
    for name in ("generator", "discriminator"):
        after_one, after_two = (optimizer_variables(checkpoints[n], name) for n in (epoch, 2 * epoch))
        iterations = next(k for k in after_one if "_iterations" in k)
        assert (after_one.pop(iterations), after_two.pop(iterations)) == (epoch, 2 * epoch)
        assert len(after_one) >= 6 and all(not np.array_equal(after_one[k], after_two[k]) for k in after_one), name

    # TensorBoard: the generated digits at each epoch's end (each run wrote its own epoch: resumed,
    # not restarted), a 4x4 tile of 8x8 digits (each in a 1-pixel border) that changed with training.
    shown = image_events(os.path.join(work, "tensorboard", "eval"))
    assert list(shown) == ["generated_digits"]
    steps = [step for step, _ in shown["generated_digits"]]
    assert steps == [epoch, 2 * epoch]
    tiles = [image for _, image in shown["generated_digits"]]
    assert all(t.shape == (40, 40, 1) for t in tiles) and not np.array_equal(tiles[0], tiles[1])

    # The exported generator, loaded and called as the server does: its warmup request replays,
    # and Predict on serving_default answers a latent vector with an 8x8x1 image in [0, 1].
    model_dir = os.path.join(second.model_dir, "Format-Serving")
    servable = Servable("digits_gan", 1, model_dir, None, RequestLimits())
    assert servable.signature_defs[DEFAULT].method_name == PREDICT_METHOD
    assert warmup.replay(servable, method_check=True) == 1
    module = load_module(str(CONFIG.parent / "model.py"))
    latent = tf.random.stateless_normal([16, module.LATENT], seed=[28, 5]).numpy()  # summary_images' vectors
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "digits_gan"
    request.inputs["latent"].CopyFrom(tf.make_tensor_proto(latent))
    response = service.predict_on(servable, request, method_check=True)
    generated = tf.make_ndarray(response.outputs["image"])
    assert generated.shape == (16, 8, 8, 1) and 0.0 <= generated.min() and generated.max() <= 1.0
    assert generated.std(axis=0).mean() > 0.01  # different vectors, different digits
    # The last TensorBoard tile is these digits (PNG rounding aside).
    tile = np.round(module.tile(tf.constant(generated), 4).numpy()[0] * 255)
    np.testing.assert_allclose(tile, tiles[-1].astype(np.float64), atol=1.0)

    # A model without heads has no examples for TFLite parity: asking for a variant is refused,
    # and the export already there is left as it was.
    before = tf.io.gfile.stat(os.path.join(model_dir, "saved_model.pb")).mtime_nsec
    generator = module.build_models(None)["generator"]
    with pytest.raises(ValueError, match=r"export.tflite_variants=\['float32'\]: the exported model 'generator' has no heads"):
        export_model(generator, {}, [], {}, model_dir, second.model_dir, "", "", ExportConfig(tflite_variants=["float32"]))
    assert tf.io.gfile.stat(os.path.join(model_dir, "saved_model.pb")).mtime_nsec == before


def test_loopline_train_splits_an_image_folder_as_the_pipeline_does(tmp_path):
    """`loopline train` reads data.path itself for image_folder: the same examples in the same
    train and eval splits as the pipeline's ExampleGen."""
    from examples.digits.make_data import write_digits
    from ingestion.file_records import FormatError, image_folder_splits

    images = tmp_path / "digits"
    write_digits(str(images), per_class=6)
    train, eval_ = image_folder_splits(str(images), str(tmp_path / "data"))
    config = make_config(tmp_path / "root", "data.format=image_folder", f"data.path={images}")
    run_example_gen(config)

    def records(pattern: str) -> set[bytes]:
        return set(tf.data.TFRecordDataset(glob.glob(pattern), "GZIP").as_numpy_iterator())

    pipeline_split = os.path.join(config.pipeline.root, "tfx", "CsvExampleGen", "examples", "*", "Split-{}", "*.gz")
    ours = {"train": records(train), "eval": records(eval_)}
    assert len(ours["train"]) + len(ours["eval"]) == 60 and len(ours["eval"]) >= 10
    assert ours == {split: records(pipeline_split.format(split)) for split in ("train", "eval")}

    (images / "3" / "notes.txt").write_text("not an image")
    with pytest.raises(FormatError, match=r"notes.txt: not a PNG, JPEG, GIF or BMP image"):
        image_folder_splits(str(images), str(tmp_path / "again"))
    with pytest.raises(FormatError, match=r"no <class>/<image> files"):
        image_folder_splits(str(tmp_path / "empty"), str(tmp_path / "again"))
