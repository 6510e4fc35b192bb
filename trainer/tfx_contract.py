"""Which contract a `trainer.module_file` follows: loopline's model module, or TFX's Trainer
module file (a top-level `run_fn(fn_args)`). Read from the source without running it, so the
pipeline's other components never import a TFX module through loopline's module rules."""
from __future__ import annotations

import ast

import tensorflow as tf

RUN_FN = "run_fn"


def defines_run_fn(module_file: str | None) -> bool:
    """Whether the module file defines `run_fn` at its top level."""
    return bool(module_file) and defines_function(module_file, RUN_FN)


def defines_function(module_file: str, name: str) -> bool:
    """Whether the module file binds `name` at its top level (a def, or an assignment such as the
    penguin example's `preprocessing_fn = base.preprocessing_fn`)."""
    with tf.io.gfile.GFile(module_file, "rb") as f:
        tree = ast.parse(f.read(), filename=module_file)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
    return False
