"""The TFLite bench's weight-byte counts, on a small Keras model whose weights are known:
the SavedModel's variables once each, and each TFLite variant's weight buffers in the stored type."""
import keras
import tensorflow as tf

from bench.tflite import saved_model_weight_bytes, tflite_weight_bytes

HIDDEN, OUT, INPUTS = 64, 3, 64
KERNEL_1, BIAS_1, KERNEL_2, BIAS_2 = INPUTS * HIDDEN, HIDDEN, HIDDEN * OUT, OUT  # element counts


def small_model() -> keras.Model:
    # Non-zero biases, as after training: the converter drops an all-zero bias input.
    bias = keras.initializers.RandomNormal(seed=1)
    inputs = keras.Input(shape=(INPUTS,), name="x")
    hidden = keras.layers.Dense(HIDDEN, activation="relu", bias_initializer=bias)(inputs)
    return keras.Model(inputs, keras.layers.Dense(OUT, bias_initializer=bias)(hidden))


def converted(model: keras.Model, variant: str) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if variant == "dynamic_range":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif variant == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    return converter.convert()


def test_weight_bytes_of_the_saved_model_and_each_tflite_variant(tmp_path):
    model = small_model()
    float_bytes = 4 * (KERNEL_1 + BIAS_1 + KERNEL_2 + BIAS_2)
    model.export(str(tmp_path / "saved"))
    assert saved_model_weight_bytes(str(tmp_path / "saved")) == float_bytes
    assert tflite_weight_bytes(converted(model, "float32")) == float_bytes
    # float16: every weight stored in half precision, widened by DEQUANTIZE at run time.
    assert tflite_weight_bytes(converted(model, "float16")) == float_bytes // 2
    # Dynamic range: the 64x64 kernel (>= 1,024 elements) as int8; smaller tensors stay float32.
    assert tflite_weight_bytes(converted(model, "dynamic_range")) == KERNEL_1 + 4 * (BIAS_1 + KERNEL_2 + BIAS_2)
