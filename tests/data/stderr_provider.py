"""A real stdio memory provider that prints a file to its stderr before it serves: the fault provider
(``memactors.testing.fault_provider``, behaving) behind a provider whose traceback or debug output carries
secrets. Usage: ``python stderr_provider.py PAYLOAD_FILE [fault provider options...]``."""

import sys

from memactors.testing.fault_provider import main

payload, *options = sys.argv[1:]
with open(payload, encoding="utf-8") as text:
    sys.stderr.write(text.read())
sys.stderr.flush()
main(options)
