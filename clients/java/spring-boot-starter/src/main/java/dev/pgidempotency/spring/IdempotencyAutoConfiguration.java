package dev.pgidempotency.spring;

import dev.pgidempotency.servlet.IdempotencyContext;
import dev.pgidempotency.servlet.IdempotencyFilter;
import jakarta.servlet.http.HttpServletRequest;
import java.util.List;
import javax.sql.DataSource;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBooleanProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.core.MethodParameter;
import org.springframework.web.bind.support.WebDataBinderFactory;
import org.springframework.web.context.request.NativeWebRequest;
import org.springframework.web.method.support.HandlerMethodArgumentResolver;
import org.springframework.web.method.support.ModelAndViewContainer;
import org.springframework.web.servlet.config.annotation.WebMvcConfigurer;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

/**
 * Registers the filter that protects {@link Idempotent} controller methods, and lets controller
 * methods take an {@link IdempotencyContext} parameter. Needs a DataSource (the application's own,
 * so same-transaction methods write through the claim's transaction) and Spring MVC.
 */
@AutoConfiguration(afterName = {
    "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
    "org.springframework.boot.webmvc.autoconfigure.WebMvcAutoConfiguration"
})
@ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
@ConditionalOnClass(RequestMappingHandlerMapping.class)
@ConditionalOnBean(DataSource.class)
@ConditionalOnBooleanProperty(name = "idempotency.enabled", matchIfMissing = true)
@EnableConfigurationProperties(IdempotencyProperties.class)
public class IdempotencyAutoConfiguration {

    @Bean
    IdempotentMethodsFilter idempotentMethodsFilter(DataSource dataSource, IdempotencyProperties properties,
            @Qualifier("requestMappingHandlerMapping") ObjectProvider<RequestMappingHandlerMapping> mappings,
            ObjectProvider<IdempotencyFilter.Tenant> tenant) {
        return new IdempotentMethodsFilter(dataSource, properties, mappings.getObject(),
                tenant.getIfAvailable(() -> IdempotentMethodsFilter.headerTenant(properties.getTenantHeader())));
    }

    @Bean
    WebMvcConfigurer idempotencyContextArgument() {
        return new WebMvcConfigurer() {
            @Override
            public void addArgumentResolvers(List<HandlerMethodArgumentResolver> resolvers) {
                resolvers.add(new HandlerMethodArgumentResolver() {
                    @Override
                    public boolean supportsParameter(MethodParameter parameter) {
                        return parameter.getParameterType() == IdempotencyContext.class;
                    }

                    @Override
                    public Object resolveArgument(MethodParameter parameter, ModelAndViewContainer mav,
                            NativeWebRequest request, WebDataBinderFactory binders) {
                        return IdempotencyContext.of(request.getNativeRequest(HttpServletRequest.class));
                    }
                });
            }
        };
    }
}
