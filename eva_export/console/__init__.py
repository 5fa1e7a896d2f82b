"""The review console: a local web page over the nodes' services, and the dataset health report.

``server`` and ``pages`` serve the page (no ROS imports; the node ``eva_console`` supplies a
backend that calls the services), ``data`` reads datasets for display only, ``report`` renders
the static health report (``eva-export report DIR``).
"""
