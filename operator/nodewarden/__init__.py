"""nodewarden: dispatches containers onto cloud VMs and side nodes; powers nodes off and on only when evidence proves it safe."""

__version__ = "0.1.0"
