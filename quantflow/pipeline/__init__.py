"""The build pipeline around the stage table (``quantflow.tasks``): one build's stages, keys and folders
(``build``), the doit task graph made from the table (``doit_graph``), content-addressed artifact keys
(``keys``), the one-build-per-folder lock (``lock``), the shared artifact cache (``cache``, over a folder or an
fsspec URL: ``store``) and builds across a Ray cluster (``farm``)."""
