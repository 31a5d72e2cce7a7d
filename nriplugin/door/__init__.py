"""numapin's NRI door: the node agent's decisions (``nodeagent``) answered through containerd's Node Resource
Interface. ``translate`` turns NRI's pods and containers into the CRI messages the core reads and the core's answers
into NRI adjustments and updates; ``records`` routes the shared pool's cpuset changes into the answer to the event
at hand; ``handler`` is the plugin's behaviour on each event."""
