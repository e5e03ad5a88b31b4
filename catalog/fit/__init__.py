"""The memory a model needs where it runs, from its own file: ``estimate`` (pure arithmetic
on a model's shape and a profile's numbers) and ``model_files`` (reading that shape from a
GGUF header or a safetensors directory, here or over HTTP). Pure helpers below the
catalog's models; the task that downloads a header is ``catalog.tasks``."""
