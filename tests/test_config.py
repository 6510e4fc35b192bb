from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent


def test_defaults_load_and_resolve_paths_against_the_file():
    config = load_config(REPO / "loopline.yaml")
    assert config.data.path == str(REPO / "data" / "penguins.csv")
    assert config.pipeline.root == str(REPO / "workspace")
    assert config.data.label == "species"


def test_overrides_are_typed_and_nested():
    config = load_config(REPO / "loopline.yaml", ["trainer.epochs=5", "trainer.learning_rate=0.5", "data.label=sex"])
    assert config.trainer.epochs == 5
    assert config.trainer.learning_rate == 0.5
    assert config.data.label == "sex"


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'trainer\.epochz'"):
        load_config(REPO / "loopline.yaml", ["trainer.epochz=3"])


def test_unknown_key_in_file_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("pipeline:\n  nmae: x\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*unknown key 'pipeline\.nmae'"):
        load_config(path)


def test_bad_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"'trainer\.epochs'.*'many'"):
        load_config(REPO / "loopline.yaml", ["trainer.epochs=many"])
    with pytest.raises(ConfigError, match=r"'trainer\.batch_size'.*greater than or equal to 1"):
        load_config(REPO / "loopline.yaml", ["trainer.batch_size=0"])


def test_malformed_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(None, ["trainer.epochs"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not a section"):
        load_config(None, ["trainer=3", "trainer.epochs=2"])
    with pytest.raises(ConfigError, match=r"--set trainer.lr_multipliers: the value '\{shared_0:' is not YAML"):
        load_config(None, ["trainer.lr_multipliers={shared_0:"])


def test_flat_lists_every_key_dotted():
    flat = load_config(REPO / "loopline.yaml").flat()
    assert flat["trainer.epochs"] == 20
    assert flat["pipeline.name"] == "penguins"


def test_metadata_path_is_relative_to_the_file_and_required_with_a_remote_root(tmp_path):
    from pipeline.config import ConfigError
    from pipeline.pipeline import metadata_path

    (tmp_path / "c.yaml").write_text("pipeline: {root: ws, metadata_path: md/store.sqlite}\n")
    assert metadata_path(load_config(tmp_path / "c.yaml")) == str(tmp_path / "md" / "store.sqlite")
    assert metadata_path(load_config(None, ["pipeline.root=/x/ws"])) == "/x/ws/metadata.sqlite"
    with pytest.raises(ConfigError, match=r"pipeline\.metadata_path is required when pipeline\.root is remote"):
        metadata_path(load_config(None, ["pipeline.root=gs://b/ws"]))
    with pytest.raises(ConfigError, match=r"pipeline\.metadata_path: 'gs://b/m\.sqlite' must be a local file"):
        metadata_path(load_config(None, ["pipeline.root=gs://b/ws", "pipeline.metadata_path=gs://b/m.sqlite"]))
