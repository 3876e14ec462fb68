"""Checkpoint files read and mended without Spark (the streaming tests run them with it)."""

from __future__ import annotations

import json

from lakehouse.checkpoints import relocate_state_schemas

SCHEMA = "state/0/_stateSchema/default/0_4a738aa9-477f-4ae2-9f03-544cc5bf3086"


def _metadata(schema_paths: list[str]) -> str:
    """An operator metadata entry as Spark 4.2 writes it for a transformWithState operator."""
    record = {
        "operatorInfo": {"operatorId": 0, "operatorName": "transformWithStateInPandasExec"},
        "stateStoreInfo": [
            {
                "storeName": "default",
                "numColsPrefixKey": 0,
                "numPartitions": 2,
                "stateSchemaFilePaths": schema_paths,
            }
        ],
        "operatorPropertiesJson": '{"timeMode":"EventTime","outputMode":"Append"}',
    }
    return "v2\n" + json.dumps(record, separators=(",", ":"))


def test_a_moved_checkpoint_names_its_own_state_schema_files(tmp_path):
    """A checkpoint built in a refresh's staging folder, then renamed into place: its operator
    metadata named the staging copy of its state schema file; it names its own, once, and the
    entry's stale checksum is gone. An entry naming the checkpoint's own file is left as is."""
    staged = tmp_path / "refresh" / "1f2e" / "checkpoints" / "gold" / "flow"
    checkpoint = tmp_path / "checkpoints" / "gold" / "flow"
    (checkpoint / SCHEMA).parent.mkdir(parents=True)
    (checkpoint / SCHEMA).write_text("schema")
    later = SCHEMA.replace("/0_", "/2_")
    (checkpoint / later).write_text("schema")
    v2 = checkpoint / "state" / "0" / "_metadata" / "v2"
    v2.mkdir(parents=True)
    (v2 / "0").write_text(_metadata([f"file:{staged}/{SCHEMA}"]))
    (v2 / ".0.crc").write_bytes(b"stale")
    own = _metadata([f"file:{checkpoint}/{SCHEMA}", f"file:{checkpoint}/{later}"])
    (v2 / "2").write_text(own)

    assert relocate_state_schemas(checkpoint) == [v2 / "0"]
    assert (v2 / "0").read_text() == _metadata([f"file:{checkpoint.resolve()}/{SCHEMA}"])
    assert not (v2 / ".0.crc").exists()
    assert (v2 / "2").read_text() == own
    assert relocate_state_schemas(checkpoint) == []
    assert sorted(p.name for p in v2.iterdir()) == ["0", "2"]
    assert not list(checkpoint.glob(".*.tmp"))


def test_a_path_to_a_file_the_checkpoint_lacks_is_left_alone(tmp_path):
    """Only a file the checkpoint holds replaces the one named (else Spark's own error
    stands, naming the missing file)."""
    checkpoint = tmp_path / "checkpoints" / "gold" / "flow"
    v2 = checkpoint / "state" / "0" / "_metadata" / "v2"
    v2.mkdir(parents=True)
    text = _metadata([f"file:{tmp_path}/elsewhere/{SCHEMA}"])
    (v2 / "0").write_text(text)
    assert relocate_state_schemas(checkpoint) == []
    assert (v2 / "0").read_text() == text
