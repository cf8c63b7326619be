"""Policies as ONNX files: the graph a family exports, the file format and its metadata, the
checked writer, the exporter callback that publishes while training, the ML-Agents profile and
the onnxruntime agent that runs either profile."""
