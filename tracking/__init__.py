"""MLflow tracking and registry for loopline: runs, batched metrics, logged and registered models,
aliases that move TF Serving's version labels. No TFX in here; components call into it."""
