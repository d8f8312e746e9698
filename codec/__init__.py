"""Pure audio-path building blocks: Xiaozhi UDP packet codec, Opus decoding, VAD segmentation.

Named ``codec`` rather than the design card's ``codecs``: ``codecs`` is a standard-library module
that Python imports at start-up, so a package of that name could never be imported.
"""
