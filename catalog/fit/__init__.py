"""The memory a model needs where it runs, from its own file: ``estimate`` (pure arithmetic
on a model's shape and a profile's numbers), ``model_files`` (reading that shape from a GGUF
header or a safetensors directory, here or over HTTP) and ``tasks`` (the download, in a
Celery task)."""
