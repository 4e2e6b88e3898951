"""What every benchmark shares: the scratch databases (``scratch``) and where things live (``paths``).

Every script, in every group, starts by putting the repository's root first on ``sys.path``
(``sys.path.insert(0, str(Path(__file__).resolve().parents[2]))``) and then imports
``bench._common...`` and ``pgmemory``: so ``python bench/<group>/<script>.py`` works from any
directory without installing ``bench``, and measures this checkout's pgmemory, not whichever
one the virtualenv happens to have installed.
"""
