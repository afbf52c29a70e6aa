"""jaxdnn's op families; the public names are re-exported by :mod:`jaxdnn`."""
