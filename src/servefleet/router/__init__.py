"""The router (vllm-router in front of the vllm instances, ``serve_router``): one component, its
pieces in one place across the layers, each module in the layer of its role
(``tests/unit/layer_table.py`` ``COMPONENTS``):

- :mod:`.plan` (host plan): its release, command line, unit and proxy, as the probe found them
- :mod:`.render` (render): its unit, its proxy's unit and nginx configuration, from the templates
  beside it (``templates/``: ``router.service.j2``, ``router-proxy.service.j2``,
  ``router-proxy.conf.j2``, shipped as package data)
- :mod:`.step` (deploy step): its user, release, proxy and, with ``serve_router = "fleet"``, the
  fleet router converged once every host is planned

Its host program stays with the others in ``base/remote/`` (``rotation.py``): the host programs
import each other as neighbours in one directory, on the host and where the tests run them.

This module imports nothing: importing any of the component's modules runs it.
"""
