"""loopline's TFX components.

In a process that runs them, Beam's default runner is its in-process FnApiRunner. Beam's
DirectRunner, the default otherwise, first tries its Prism runner on any pipeline Prism supports
(the CSV ExampleGen's, StatisticsGen's): it downloads Prism's binary from GitHub and runs the
pipeline in a Go subprocess or, offline, fails a DNS lookup and falls back to the FnApiRunner.
The default is set here rather than added to the Beam args because TFX packages itself as an sdist
for every Beam component whose Beam args are not empty. A runner in `pipeline.beam_args` still wins.
"""
from apache_beam.options.pipeline_options import StandardOptions

IN_PROCESS_RUNNER = "FnApiRunner"
StandardOptions.DEFAULT_RUNNER = IN_PROCESS_RUNNER
