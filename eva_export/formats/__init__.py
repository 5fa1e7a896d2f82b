"""On-disk formats, one package each (layout, reader, writer, verifier side by side) over the shared
pieces in ``common``; the format and source-kind registries and ``verify_export`` on top."""
