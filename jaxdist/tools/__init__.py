"""Tools around programs: a futures pool over worker nodes (``pool``, ``jd.Pool``), certificates
for mutual TLS (``python -m jaxdist.tools.certs``) and playing a trained policy
(``python -m jaxdist.tools.evaluate``)."""
