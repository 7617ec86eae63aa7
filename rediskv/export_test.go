package rediskv

// Slot exposes slot to the tests.
var Slot = slot
