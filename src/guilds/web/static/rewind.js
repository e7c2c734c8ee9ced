// The Rewind button of a call row (guilds/web/rewind.py): asks to confirm, then
// posts with the header X-Guilds-Rewind and the page's own origin, and shows the
// server's one line beside the button.
(function () {
  "use strict";

  function show(button, text, failed) {
    var line = button.parentNode.querySelector(".rewound") || document.createElement("span");
    line.className = failed ? "rewound failed" : "rewound";
    line.textContent = text;
    button.after(line);
  }

  function rewind(button) {
    var seq = button.closest("li.item").dataset.seq;
    if (!window.confirm("Put the files back as they were before call " + seq +
                        "? Background commands are stopped first.")) return;
    button.disabled = true;
    fetch(button.dataset.rewind, {method: "POST", credentials: "same-origin", referrerPolicy: "same-origin",
                                  headers: {"X-Guilds-Rewind": "1"}})
      .then(function (response) { return response.json(); })
      .then(function (answer) { show(button, answer.text || answer.error, !answer.text); })
      .catch(function (error) { show(button, "The rewind was not answered: " + error, true); })
      .then(function () { button.disabled = false; });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.rewind");
    if (button) { event.preventDefault(); rewind(button); }
  });
})();
