module.exports = () => require('./secrets-scan').setup();
