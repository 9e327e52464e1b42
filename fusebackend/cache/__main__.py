"""``python -m fusebackend.cache [--clear] [--dir DIR]``: show or clear the cache folder."""

from fusebackend.cache import main

main()
