"""The ranking wing: the SQL of the search and the recall statements, built from named parts.

A search is one statement: the scope's vector candidates (:mod:`.candidates`), the keyword
ranking (:mod:`.keywords`), the mode's ranking into ``top`` (:mod:`.top`, fusing the two with
recency in :mod:`.fusion`), the hits read back (:mod:`.top`) with what each signal contributed
(:mod:`.signals`), and, unless off, the recall audit row (:mod:`.audit`). The builder is
:func:`pgmemory.store._ranking.search.search_memories`.

A recall is one statement too (:func:`pgmemory.store._ranking.recall.recall_memories`): the
same ranking, walked in rank order past recent turns and near-duplicates, then cut to the
token budget (:mod:`.budget`, which also sizes the budget's parameters) with its audit row.

Every part filters the scope the same way and reads ranked rows back one primary-key probe
each (:mod:`.scope`). Each module returns SQL text and does no I/O; the statements run through
the engine (:mod:`pgmemory.store._engine`) like every other.
"""
