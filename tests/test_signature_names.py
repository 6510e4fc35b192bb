"""The export contract has one definition (serving/signature_names.py); the MLflow model file,
which MLflow copies alone, keeps copies that must stay equal to it."""
import ast
from pathlib import Path

from serving import signature_names as names


def _constants(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                out[node.targets[0].id] = ast.unparse(node.value)
    return out


def test_the_mlflow_model_file_copies_the_contract():
    copies = _constants(Path(__file__).parents[1] / "tracking" / "pyfunc_model.py")
    assert copies["PREDICT_RAW"] == names.PREDICT_RAW
    assert copies["PREDICT"] == names.PREDICT
    # os.path.join(ASSETS_EXTRA, SIGNATURE_FILE), spelled out
    assert copies["SIGNATURE_FILE"] == f"os.path.join({names.ASSETS_EXTRA!r}, {names.SIGNATURE_FILE!r})"


def test_sidecar_and_warmup_paths_sit_in_assets_extra():
    assert names.signature_file("/m/3") == "/m/3/assets.extra/loopline_signature.json"
    assert names.warmup_file("gs://b/m/3") == "gs://b/m/3/assets.extra/tf_serving_warmup_requests"
