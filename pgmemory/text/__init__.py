"""Text shared by the store and the memory providers: keyword terms, and the normalisation
every stored or searched text goes through (:mod:`pgmemory.text.clean`); and ids as the
command line and the audit page show them to a person (:mod:`pgmemory.text.visible`)."""
