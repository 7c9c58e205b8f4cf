// Swagger UI on nestgate's own OpenAPI document. The token is typed into
// "Authorize" and kept in this page only (not in local storage).
window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/docs/json",
    dom_id: "#swagger-ui",
    presets: [SwaggerUIBundle.presets.apis],
    layout: "BaseLayout",
    deepLinking: true,
    persistAuthorization: false,
    tryItOutEnabled: false,
  });
});
