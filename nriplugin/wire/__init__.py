"""NRI's transport, one concept per module: the trunk multiplexer (``mux``), ttrpc's message framing (``ttrpc``), its
status codes (``codes``), stream ids (``streams``), the envelopes (``envelope``) and one trunk connection over a unix
socket (``trunk``). Nothing here knows NRI's messages: that is the session's (``nriplugin.session``)."""
