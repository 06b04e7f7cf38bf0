"""The SGLang recorder: plugin entry point (``plugin``), hooks (``hooks``), every SGLang name it
touches (``adapter``), the live contract (``contract``), row attribution (``attribution``), the
draft's midlayer taps (``draft_stages``), options (``options``) and the CPU recipe (``cpu``)."""
