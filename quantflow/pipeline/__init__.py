"""The build pipeline around the stage table (``quantflow.tasks``): one build's stages, keys and folders
(``build``), the doit task graph made from the table (``doit_graph``), content-addressed artifact keys
(``keys``) and the one-build-per-folder lock (``lock``)."""
