"""The tests of tidings, one folder per part of ``src/tidings`` (``tests/server`` for
``tidings.server``, ...), ``tests/system`` for what crosses parts, ``tests/support`` for the
helpers they share. Each part's folder marks its tests with the part's name: ``pytest
tests/server`` or ``pytest -m server`` runs one part."""
