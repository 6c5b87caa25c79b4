"""The data the package ships and reads with importlib.resources (the redaction rules); no code.

With the pure modules in the layers: nothing here imports anything."""
