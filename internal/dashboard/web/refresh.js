// The fleet page refreshes itself every 5s while it is visible.
"use strict";
setInterval(function () {
  if (document.visibilityState === "visible") { location.reload(); }
}, 5000);
