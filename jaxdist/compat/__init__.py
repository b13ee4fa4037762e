"""Other systems' APIs over jaxdist, so that programs written for them run here unchanged:
`jaxdist.compat.launchpad` (``import jaxdist.compat.launchpad as lp``)."""
