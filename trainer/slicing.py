"""Slices of the eval split (TFMA's SlicingSpec: feature_keys / feature_values, plus loopline's
numeric buckets) and the per-slice figures the Evaluator writes beside blessing.json."""
from __future__ import annotations

# The per-slice figures in the blessing folder (ModelBlessing's uri), beside blessing.json; the
# model card and the Registrar read it.
SLICES_JSON = "slices.json"
# The TFMA-format evaluation (tfma.load_eval_result reads it), a folder in the blessing folder.
TFMA_FOLDER = "tfma"
# The name of the slice of all examples, as TFMA's tools show it.
OVERALL = "Overall"
