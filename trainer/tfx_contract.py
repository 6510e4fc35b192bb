"""Which contract a `trainer.module_file` follows: loopline's model module, or TFX's Trainer
module file (a top-level `run_fn(fn_args)`). Read from the source without running it, so the
pipeline's other components never import a TFX module through loopline's module rules."""
from __future__ import annotations

import ast

import tensorflow as tf

RUN_FN = "run_fn"


def defines_run_fn(module_file: str | None) -> bool:
    """Whether the module file defines `run_fn` at its top level (a def, or a name bound to one)."""
    if not module_file:
        return False
    with tf.io.gfile.GFile(module_file, "rb") as f:
        tree = ast.parse(f.read(), filename=module_file)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == RUN_FN:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == RUN_FN for t in node.targets):
            return True
    return False
