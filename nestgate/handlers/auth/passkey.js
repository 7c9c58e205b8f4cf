// The sign-in and account pages' passkey buttons (nestgate.auth.passkeys): ask the
// server for a ceremony's options, let the browser run it, and post its answer with the
// page's own form, so the server answers as it answers that form.
"use strict";
(() => {
  const form = document.querySelector("form");
  const note = document.getElementById("passkey-note");
  const signIn = document.getElementById("passkey-signin");
  const add = document.getElementById("passkey-add");
  if (!form || !window.PublicKeyCredential || !PublicKeyCredential.parseRequestOptionsFromJSON) {
    return;                       // no WebAuthn here: the buttons stay hidden
  }

  async function options(purpose) {
    const body = new URLSearchParams({csrf: form.elements.csrf.value, purpose});
    const answer = await fetch("/__auth__/passkey/options", {method: "POST", body,
                                                             credentials: "same-origin"});
    const value = await answer.json();
    if (!answer.ok) throw new Error(value.error || answer.statusText);
    return value;
  }

  function post(action, fields) {
    for (const [name, value] of Object.entries(fields)) {
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = value;
      form.appendChild(input);
    }
    form.action = action;
    form.submit();
  }

  async function run(button, ceremony) {
    button.disabled = true;
    note.textContent = "";
    try {
      await ceremony();
    } catch (error) {
      note.textContent = "Passkey: " + error.message;
      button.disabled = false;
    }
  }

  if (signIn) {
    signIn.hidden = false;
    signIn.addEventListener("click", () => run(signIn, async () => {
      const publicKey = PublicKeyCredential.parseRequestOptionsFromJSON(await options("signin"));
      const credential = await navigator.credentials.get({publicKey});
      // With the user and password filled in, the passkey stands in for the code; left
      // empty, it signs in alone.
      post("/__auth__/passkey", {credential: JSON.stringify(credential.toJSON())});
    }));
  }
  if (add) {
    add.hidden = false;
    add.addEventListener("click", () => run(add, async () => {
      const publicKey = PublicKeyCredential.parseCreationOptionsFromJSON(await options("register"));
      const credential = await navigator.credentials.create({publicKey});
      post("/__auth__/account", {action: "add", credential: JSON.stringify(credential.toJSON()),
                                 name: document.getElementById("passkey-name").value});
    }));
  }
})();
